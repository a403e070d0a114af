package kernel_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/bbolt"
)

// TestInvalidIDsSayTheRule: an agent, tenant or bundle id that ValidID
// refuses is a validation error that says what an id may be.
func TestInvalidIDsSayTheRule(t *testing.T) {
	st, err := bbolt.Open(filepath.Join(t.TempDir(), "wicket.db"), bbolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	k, err := kernel.New(st, nil, nil, nil, kernel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const bad = "bad id!"
	_, errCreate := k.CreateTenant(ctx, kernel.Tenant{ID: bad})
	errEnsure := k.EnsureTenant(ctx, bad)
	_, errAgent := k.PutAgent(ctx, kernel.Agent{ID: bad, Secret: "0123456789abcdef"})
	for name, err := range map[string]error{"CreateTenant": errCreate, "EnsureTenant": errEnsure, "PutAgent": errAgent} {
		if kernel.CodeOf(err) != kernel.CodeValidation || !strings.Contains(err.Error(), `"bad id!" is invalid: `+kernel.IDRule) {
			t.Errorf("%s(%q): %v", name, bad, err)
		}
	}
}
