package bbolt

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// TestTenantCacheFollowsTheRecord: read transactions keep decoded tenant
// records (every step policy decides reads its tenant's guards), but a
// read after the record changed sees the change, and a caller
// changing what it was handed, slices included, does not change what the
// next read gets.
func TestTenantCacheFollowsTheRecord(t *testing.T) {
	s := openStore(t, Options{}, true)
	ctx := context.Background()
	put := func(ten kernel.Tenant) {
		t.Helper()
		if err := s.Update(ctx, func(tx kernel.Tx) error { return tx.PutTenant(&ten) }); err != nil {
			t.Fatal(err)
		}
	}
	read := func() (*kernel.Tenant, error) { return s.viewTenant(ctx, "acme") }
	keys := []kernel.BundleKey{{ID: "ci", Algorithm: "HS256", Key: "secret-one"}}
	put(kernel.Tenant{ID: "acme", Guards: []string{"g1", "g2"}, BundleKeys: keys})
	for i := range 3 { // the later reads are the cache's
		ten, err := read()
		if err != nil || !slices.Equal(ten.Guards, []string{"g1", "g2"}) || !slices.Equal(ten.BundleKeys, keys) {
			t.Fatalf("read %d: %+v, %v", i, ten, err)
		}
		ten.Guards[0], ten.BundleKeys[0].Key = "changed by the caller", "changed by the caller"
		ten.Guards = append(ten.Guards, "appended by the caller")
	}
	put(kernel.Tenant{ID: "acme", Guards: []string{"g3"}})
	if ten, err := read(); err != nil || !slices.Equal(ten.Guards, []string{"g3"}) || len(ten.BundleKeys) != 0 {
		t.Fatalf("after the update: %+v, %v", ten, err)
	}
	if ten, err := s.viewTenant(ctx, "other"); !errors.Is(err, kernel.ErrNotFound) {
		t.Fatalf("a tenant without a record: %+v, %v", ten, err)
	}
}

// viewTenant reads a tenant's record in a View.
func (s *Store) viewTenant(ctx context.Context, id string) (*kernel.Tenant, error) {
	var ten *kernel.Tenant
	err := s.View(ctx, func(tx kernel.ReadTx) error {
		var err error
		ten, err = tx.Tenant(id)
		return err
	})
	return ten, err
}

// TestTenantCacheCopiesShareNothing: readTx.Tenant hands out a shallow copy
// of the cached record with its two slices copied, which is a fresh record
// only while kernel.Tenant holds strings, bools, times and those slices
// (of strings, and of BundleKeys, which hold strings).
func TestTenantCacheCopiesShareNothing(t *testing.T) {
	plain := func(ty reflect.Type) bool {
		k := ty.Kind()
		return k == reflect.String || k == reflect.Bool || ty == reflect.TypeFor[time.Time]()
	}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[kernel.Tenant]()) {
		switch {
		case plain(f.Type), f.Name == "Guards" && f.Type == reflect.TypeFor[[]string](),
			f.Name == "BundleKeys" && f.Type == reflect.TypeFor[[]kernel.BundleKey]():
		default:
			t.Errorf("kernel.Tenant.%s is a %s: readTx.Tenant must copy it deeply", f.Name, f.Type)
		}
	}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[kernel.BundleKey]()) {
		if !plain(f.Type) {
			t.Errorf("kernel.BundleKey.%s is a %s: readTx.Tenant must copy it deeply", f.Name, f.Type)
		}
	}
}
