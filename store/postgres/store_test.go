package postgres_test

import (
	"context"
	"testing"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/storetest"
	"github.com/wicket-run/wicket/store/postgres"
	"github.com/wicket-run/wicket/store/postgres/pgtest"
)

// openChecked opens a store in a schema of its own whose cleanup checks the
// invariants.
func openChecked(t testing.TB, opts postgres.Options) *postgres.Store {
	t.Helper()
	s := pgtest.Open(t, opts)
	t.Cleanup(func() {
		if err := s.Check(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	pgtest.BaseDSN(t)
	storetest.Run(t, func(t *testing.T) kernel.Store { return openChecked(t, postgres.Options{}) })
}

func TestConformanceNoGroupCommit(t *testing.T) {
	pgtest.BaseDSN(t)
	storetest.Run(t, func(t *testing.T) kernel.Store { return openChecked(t, postgres.Options{MaxBatch: 1}) })
}

func TestConformanceSerializable(t *testing.T) {
	pgtest.BaseDSN(t)
	storetest.Run(t, func(t *testing.T) kernel.Store { return openChecked(t, postgres.Options{Serializable: true}) })
}
