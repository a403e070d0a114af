package postgres_test

import (
	"testing"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/storetest"
	"github.com/wicket-run/wicket/store/postgres"
	"github.com/wicket-run/wicket/store/postgres/pgtest"
)

// benchOpen opens a store in a schema of its own and remembers it, so that
// the benchmark can report its commit statistics.
func benchOpen(s **postgres.Store, opts postgres.Options) func(b *testing.B) kernel.Store {
	return func(b *testing.B) kernel.Store {
		*s = pgtest.Open(b, opts)
		return *s
	}
}

// reportCommits reports how many Update functions shared a commit, and the
// serialization failures retried.
func reportCommits(b *testing.B, s *postgres.Store) {
	st := s.Stats()
	if st.Commits > 0 {
		b.ReportMetric(float64(st.Updates)/float64(st.Commits), "ops/commit")
	}
	b.ReportMetric(float64(st.Conflicts), "conflicts")
}

// BenchmarkUpdateSerial: one writer, one commit per step submission (the
// storetest transaction: read the execution and a counter, write a step, a
// counter, three events and the execution).
func BenchmarkUpdateSerial(b *testing.B) {
	var s *postgres.Store
	storetest.BenchUpdateSerial(b, benchOpen(&s, postgres.Options{}))
	reportCommits(b, s)
}

// BenchmarkUpdateParallel: 8×GOMAXPROCS writers sharing commits.
func BenchmarkUpdateParallel(b *testing.B) {
	var s *postgres.Store
	b.SetParallelism(8)
	storetest.BenchUpdate(b, benchOpen(&s, postgres.Options{}))
	reportCommits(b, s)
}

// BenchmarkUpdateParallelNoGroupCommit: the same writers, one transaction
// each (MaxBatch 1): what group commit buys.
func BenchmarkUpdateParallelNoGroupCommit(b *testing.B) {
	var s *postgres.Store
	b.SetParallelism(8)
	storetest.BenchUpdate(b, benchOpen(&s, postgres.Options{MaxBatch: 1}))
	reportCommits(b, s)
}
