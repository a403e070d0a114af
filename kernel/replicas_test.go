package kernel_test

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/store/bbolt"
)

// feedStore is a store shared with other (imaginary) replicas: the test
// writes their records straight into the store and announces them on
// changes, as PostgreSQL's NOTIFY would.
type feedStore struct {
	*bbolt.Store
	changes chan kernel.Change
}

func (f *feedStore) Follow(ctx context.Context, fn func(kernel.Change)) error {
	for {
		select {
		case c := <-f.changes:
			fn(c)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// loader is a BundleLoader whose bundles are their archive's text; it
// records what is live.
type loader struct {
	mu       sync.Mutex
	live     map[string]string // tenant/name → digest
	compiles int
}

func (l *loader) Compile(_ context.Context, _ string, src kernel.BundleSource) (*kernel.CompiledBundle, error) {
	l.mu.Lock()
	l.compiles++
	l.mu.Unlock()
	name, digest, _ := cut(string(src.Archive))
	return &kernel.CompiledBundle{Ref: policy.BundleRef{Name: name, Revision: digest, Digest: digest, Engine: "test"}, Archive: src.Archive}, nil
}

func cut(s string) (string, string, bool) {
	for i := range s {
		if s[i] == '@' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func (l *loader) Activate(tenant string, cb *kernel.CompiledBundle) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.live[tenant+"/"+cb.Ref.Name] = cb.Ref.Digest
}

func (l *loader) Remove(tenant, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.live, tenant+"/"+name)
}

func (l *loader) Discard(*kernel.CompiledBundle) {}

func (l *loader) Failed(string, string, error) {}

func (l *loader) RulesBundle(string, []byte) (kernel.BundleSource, error) {
	return kernel.BundleSource{}, nil
}

func (l *loader) digest(key string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.live[key]
}

type noDeliveries struct{}

func (noDeliveries) Deliver(context.Context, kernel.Delivery) error { return nil }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFollowOtherReplicas: what another replica commits, announced by the
// store's Feed, wakes the event streams, drops the cached agent, and makes
// the stored bundle revision live (or removes a deleted bundle); after a
// gap (Change.All) everything is refreshed.
func TestFollowOtherReplicas(t *testing.T) {
	st, err := bbolt.Open(filepath.Join(t.TempDir(), "wicket.db"), bbolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fs := &feedStore{Store: st, changes: make(chan kernel.Change)}
	l := &loader{live: map[string]string{}}
	k, err := kernel.New(fs, noDeliveries{}, nil, l, kernel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer k.Close(ctx)
	other := func(fn func(tx kernel.Tx) error) {
		t.Helper()
		if err := st.Update(ctx, fn); err != nil {
			t.Fatal(err)
		}
	}

	// An event stream wakes for another replica's events.
	wake, stop := k.Watch("exec-1")
	defer stop()
	fs.changes <- kernel.Change{Executions: []string{"exec-2", "exec-1"}}
	select {
	case <-wake:
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher was not woken")
	}

	// A cached agent is dropped when another replica changes it.
	if _, err := k.PutAgent(ctx, kernel.Agent{ID: "a", WebhookURL: "http://127.0.0.1:1/old", Secret: "0123456789abcdef"}); err != nil {
		t.Fatal(err)
	}
	other(func(tx kernel.Tx) error {
		return tx.PutAgent(&kernel.Agent{ID: "a", Tenant: kernel.DefaultTenant, WebhookURL: "http://127.0.0.1:1/new", Secret: "0123456789abcdef"})
	})
	if a, _ := k.Agent(ctx, kernel.DefaultTenant, "a"); a.WebhookURL != "http://127.0.0.1:1/old" {
		t.Fatalf("the kernel did not cache the agent: %s", a.WebhookURL)
	}
	fs.changes <- kernel.Change{Agents: []kernel.Ref{{Tenant: kernel.DefaultTenant, Name: "a"}}}
	waitFor(t, "the new agent", func() bool {
		a, err := k.Agent(ctx, kernel.DefaultTenant, "a")
		return err == nil && a.WebhookURL == "http://127.0.0.1:1/new"
	})

	// Bundles follow the store: a new one, a new revision, the same
	// revision again (not recompiled), a deletion.
	put := func(digest string) {
		other(func(tx kernel.Tx) error {
			return tx.PutBundle(&kernel.BundleRecord{Tenant: kernel.DefaultTenant, Name: "b", Revision: digest, Digest: digest, Engine: "test", Archive: []byte("b@" + digest)})
		})
		fs.changes <- kernel.Change{Bundles: []kernel.Ref{{Tenant: kernel.DefaultTenant, Name: "b"}}}
	}
	put("d1")
	waitFor(t, "revision d1 live", func() bool { return l.digest("default/b") == "d1" })
	put("d2")
	waitFor(t, "revision d2 live", func() bool { return l.digest("default/b") == "d2" })
	l.mu.Lock()
	compiles := l.compiles
	l.mu.Unlock()
	fs.changes <- kernel.Change{Bundles: []kernel.Ref{{Tenant: kernel.DefaultTenant, Name: "b"}}}
	fs.changes <- kernel.Change{} // handled in order: the previous change is done
	l.mu.Lock()
	if l.compiles != compiles {
		t.Errorf("the live revision was compiled again (%d compiles, want %d)", l.compiles, compiles)
	}
	l.mu.Unlock()
	other(func(tx kernel.Tx) error { return tx.DeleteBundle(kernel.DefaultTenant, "b") })
	fs.changes <- kernel.Change{Bundles: []kernel.Ref{{Tenant: kernel.DefaultTenant, Name: "b"}}}
	waitFor(t, "the deleted bundle removed", func() bool { return l.digest("default/b") == "" })

	// After a gap: every watcher woken, bundles synced with the store.
	other(func(tx kernel.Tx) error {
		for _, n := range []string{"c", "d"} {
			if err := tx.PutBundle(&kernel.BundleRecord{Tenant: kernel.DefaultTenant, Name: n, Digest: n + "1", Archive: []byte(n + "@" + n + "1")}); err != nil {
				return err
			}
		}
		return nil
	})
	fs.changes <- kernel.Change{All: true}
	select {
	case <-wake:
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher was not woken after a gap")
	}
	waitFor(t, "bundles synced after a gap", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		var keys []string
		for k := range l.live {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return slices.Equal(keys, []string{"default/c", "default/d"})
	})
}

// pausingStore is a feedStore whose View, once armed, holds the caller of
// the first View that read an agent after that View's snapshot ended and
// before it returns: a read that began before another replica's change and
// ends after the kernel dropped what the change made stale.
type pausingStore struct {
	*feedStore
	armed   atomic.Bool
	read    chan struct{} // closed when the armed View has read an agent
	release chan struct{} // closed by the test to let it return
}

type agentSpy struct {
	kernel.ReadTx
	saw *bool
}

func (a agentSpy) Agent(tenant, id string) (*kernel.Agent, error) {
	*a.saw = true
	return a.ReadTx.Agent(tenant, id)
}

func (p *pausingStore) View(ctx context.Context, fn func(tx kernel.ReadTx) error) error {
	saw := false
	err := p.feedStore.View(ctx, func(tx kernel.ReadTx) error { return fn(agentSpy{tx, &saw}) })
	if saw && p.armed.CompareAndSwap(true, false) {
		close(p.read)
		<-p.release
	}
	return err
}

// TestAgentCacheNotStale: a replica reads an agent into its cache while
// another replica changes it (a new secret, webhook or policy binding). The
// read began before the change and ends after the change's announcement
// dropped the cached copy: the stale copy must not be cached, or the replica
// would keep using the old secret and binding until the agent's next
// change. Before the fix the replica kept the old webhook.
func TestAgentCacheNotStale(t *testing.T) {
	st, err := bbolt.Open(filepath.Join(t.TempDir(), "wicket.db"), bbolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ps := &pausingStore{feedStore: &feedStore{Store: st, changes: make(chan kernel.Change)},
		read: make(chan struct{}), release: make(chan struct{})}
	k, err := kernel.New(ps, noDeliveries{}, nil, nil, kernel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer k.Close(ctx)
	put := func(url string) {
		t.Helper()
		if err := st.Update(ctx, func(tx kernel.Tx) error {
			return tx.PutAgent(&kernel.Agent{ID: "a", Tenant: kernel.DefaultTenant, WebhookURL: url, Secret: "0123456789abcdef"})
		}); err != nil {
			t.Fatal(err)
		}
	}
	put("http://127.0.0.1:1/old")
	ps.armed.Store(true)
	first := make(chan *kernel.Agent, 1)
	go func() {
		a, err := k.Agent(ctx, kernel.DefaultTenant, "a")
		if err != nil {
			t.Error(err)
		}
		first <- a
	}()
	<-ps.read
	// Another replica changes the agent and announces it; the empty change
	// after it returns once the announcement is handled.
	put("http://127.0.0.1:1/new")
	ps.changes <- kernel.Change{Agents: []kernel.Ref{{Tenant: kernel.DefaultTenant, Name: "a"}}}
	ps.changes <- kernel.Change{}
	close(ps.release)
	if a := <-first; a == nil || a.WebhookURL != "http://127.0.0.1:1/old" {
		t.Fatalf("the read that began before the change: %+v", a)
	}
	a, err := k.Agent(ctx, kernel.DefaultTenant, "a")
	if err != nil {
		t.Fatal(err)
	}
	if a.WebhookURL != "http://127.0.0.1:1/new" {
		t.Errorf("after the change was announced the replica uses %s, want the new webhook", a.WebhookURL)
	}
}
