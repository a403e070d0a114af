package bbolt

import (
	"testing"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/storetest"
)

// benchOpen opens a store with fsync on, as in production, and remembers
// it so that the benchmark can report its commit statistics.
func benchOpen(s **Store, opts Options) func(b *testing.B) kernel.Store {
	return func(b *testing.B) kernel.Store {
		*s = openStore(b, opts, true)
		return *s
	}
}

// reportCommits reports how many Update functions shared a commit.
func reportCommits(b *testing.B, s *Store) {
	st := s.Stats()
	if st.Commits > 0 {
		b.ReportMetric(float64(st.Updates)/float64(st.Commits), "ops/commit")
	}
}

// BenchmarkUpdateSerial: one writer, one commit (two fsyncs) per submit.
func BenchmarkUpdateSerial(b *testing.B) {
	var s *Store
	storetest.BenchUpdateSerial(b, benchOpen(&s, Options{}))
	reportCommits(b, s)
}

// BenchmarkUpdateParallel: 8×GOMAXPROCS writers sharing commits.
func BenchmarkUpdateParallel(b *testing.B) {
	var s *Store
	b.SetParallelism(8)
	storetest.BenchUpdate(b, benchOpen(&s, Options{}))
	reportCommits(b, s)
}

// BenchmarkUpdateSerialNoSync is BenchmarkUpdateSerial without fsync: the
// CPU cost of the transaction itself.
func BenchmarkUpdateSerialNoSync(b *testing.B) {
	var s *Store
	storetest.BenchUpdateSerial(b, benchOpen(&s, Options{NoSync: true}))
	reportCommits(b, s)
}

// BenchmarkUpdateParallelNoSync is BenchmarkUpdateParallel without fsync.
func BenchmarkUpdateParallelNoSync(b *testing.B) {
	var s *Store
	b.SetParallelism(8)
	storetest.BenchUpdate(b, benchOpen(&s, Options{NoSync: true}))
	reportCommits(b, s)
}
