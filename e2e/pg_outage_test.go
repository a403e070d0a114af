package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/postgres"
)

// pgCluster is a PostgreSQL cluster of the test's own, run by
// .ci/postgres.sh in a directory of its own (listening on a Unix socket
// there only), so that the test may crash and restart it without touching
// the database other tests share.
type pgCluster struct {
	dir string
	dsn string
}

// newPGCluster starts a private cluster; it skips when PostgreSQL's
// binaries are not installed.
func newPGCluster(t *testing.T) *pgCluster {
	t.Helper()
	if bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl"); len(bins) == 0 {
		if _, err := exec.LookPath("pg_ctl"); err != nil {
			t.Skip("PostgreSQL is not installed (no pg_ctl): this test crashes a cluster of its own; apt-get install postgresql")
		}
	}
	parent, err := os.MkdirTemp("", "wicket-pg-outage-")
	if err != nil {
		t.Fatal(err)
	}
	// The server runs as the postgres user when the tests run as root.
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &pgCluster{dir: filepath.Join(parent, "pg")}
	t.Cleanup(func() {
		c.run(t, "clean")
		_ = os.RemoveAll(parent)
	})
	for _, line := range strings.Split(c.run(t, "start"), "\n") {
		if v, ok := strings.CutPrefix(line, "export WICKET_TEST_POSTGRES="); ok {
			c.dsn = strings.Trim(v, "'")
		}
	}
	if c.dsn == "" {
		t.Fatal("postgres.sh start printed no WICKET_TEST_POSTGRES")
	}
	return c
}

// run runs .ci/postgres.sh cmd on the cluster.
func (c *pgCluster) run(t *testing.T, cmd string) string {
	t.Helper()
	sh := exec.Command("bash", "../.ci/postgres.sh", cmd)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WICKET_PG_") { // no TCP port, no other directory
			sh.Env = append(sh.Env, kv)
		}
	}
	sh.Env = append(sh.Env, "WICKET_PG_DIR="+c.dir)
	out, err := sh.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("postgres.sh %s: %v: %s", cmd, err, ee.Stderr)
		}
		t.Fatalf("postgres.sh %s: %v", cmd, err)
	}
	return string(out)
}

// TestPostgresCrashed: two `wicket serve` replicas on one database, agents
// running executions through a balancer, and the database server crashes
// (pg_ctl stop -m immediate) and comes back. While it is down every
// request is answered 503 `unavailable` (never a 500); once it is back the
// replicas serve again without a restart, every execution completes, every
// step whose completion was acknowledged is recorded with its result, no
// acknowledged effect runs again, no dispatch attempt is claimed twice,
// and the database passes its checker.
func TestPostgresCrashed(t *testing.T) {
	pg := newPGCluster(t)
	urls := make([]string, 2)
	for i := range urls {
		p := startServe(t, t.TempDir(), freeAddr(t), "--store", pg.dsn, "--replica", fmt.Sprintf("r%d", i),
			"--lease-timeout", "2s", "--dispatch-timeout", "500ms")
		urls[i] = p.url
		defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	}
	lb := newBalancer(t, urls...)

	// Every answer other than a 2xx, by status and code.
	var mu sync.Mutex
	answers := map[string]int{}
	note := func(who string, status int, code string) {
		mu.Lock()
		answers[fmt.Sprintf("%s %d %s", who, status, code)]++
		mu.Unlock()
	}
	const steps = 10
	led := &ackLedger{acked: map[string]json.RawMessage{}, ran: map[string]int{}}
	agent := testkit.NewAgent("worker", secret, lb.URL(), func(ctx context.Context, r *testkit.Run) (any, error) {
		for i := range steps {
			res, err := r.Step(ctx, "tool_call", "work", map[string]int{"i": i}, testkit.StepOpts{Idempotency: "safe_to_retry"}, func() (any, error) {
				key := r.ExecutionID + "/" + r.Decisions[len(r.Decisions)-1].StepID
				led.mu.Lock()
				defer led.mu.Unlock()
				led.ran[key]++
				if _, done := led.acked[key]; done {
					led.after = append(led.after, key)
				}
				return i * i, nil
			})
			var ae *testkit.APIError
			switch {
			case err == nil:
			case errors.As(err, &ae):
				note("agent", ae.Status, ae.Code)
				if ae.Status >= 500 {
					// The database is down: this attempt ends, the lease
					// runs out, and the dispatch comes again.
					return nil, testkit.ErrAbandon
				}
				return nil, err
			default:
				return nil, err
			}
			d := r.Decisions[len(r.Decisions)-1]
			if d.Decision == kernel.DecisionProceed {
				led.mu.Lock()
				led.acked[r.ExecutionID+"/"+d.StepID] = res
				led.mu.Unlock()
			}
		}
		return "finished", nil
	})
	agent.HeartbeatEvery = 300 * time.Millisecond
	defer agent.Close()
	if _, err := testkit.Bearer(urls[0], testkit.AdminKey, "POST", "/v0/agents", map[string]any{"id": "worker", "webhook_url": agent.WebhookURL(), "secret": secret}, nil); err != nil {
		t.Fatal(err)
	}
	const n = 12
	ids := make([]string, n)
	for i := range ids {
		var x kernel.Execution
		if _, err := testkit.Bearer(lb.URL(), testkit.AdminKey, "POST", "/v0/executions", map[string]any{"agent_id": "worker"}, &x); err != nil {
			t.Fatal(err)
		}
		ids[i] = x.ID
	}
	// Readers on both replicas all along; each replica's count of 503s
	// says it saw the outage.
	stop := make(chan struct{})
	var readers sync.WaitGroup
	unavailable := make([]int, len(urls))
	for i, u := range urls {
		readers.Add(1)
		go func() {
			defer readers.Done()
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				st, err := testkit.Bearer(u, testkit.AdminKey, "GET", "/v0/executions/"+ids[k%n], nil, nil)
				var ae *testkit.APIError
				switch {
				case errors.As(err, &ae):
					note("reader", st, ae.Code)
				case err != nil:
					note("reader", st, err.Error())
				}
				if err != nil {
					if st == 503 {
						mu.Lock()
						unavailable[i]++
						mu.Unlock()
					}
				}
			}
		}()
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			readers.Wait()
		}
	}()

	eventually(t, 60*time.Second, "a quarter of the steps acknowledged", func() (bool, string) {
		led.mu.Lock()
		defer led.mu.Unlock()
		return len(led.acked) >= n*steps/4, fmt.Sprint(len(led.acked))
	})
	pg.run(t, "kill")
	eventually(t, 30*time.Second, "both replicas answer 503 while the database is down", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return unavailable[0] > 0 && unavailable[1] > 0, fmt.Sprint(unavailable)
	})
	pg.run(t, "start")

	for _, id := range ids {
		var x kernel.Execution
		eventually(t, 120*time.Second, "execution "+id+" completes", func() (bool, string) {
			if _, err := testkit.Bearer(urls[0], testkit.AdminKey, "GET", "/v0/executions/"+id, nil, &x); err != nil {
				return false, err.Error()
			}
			return x.Status.Terminal(), string(x.Status)
		})
		if x.Status != kernel.ExecCompleted {
			t.Errorf("execution %s: %s (%s)", id, x.Status, x.Error)
		}
		evs, err := testkit.AllEvents(urls[1], testkit.AdminKey, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := testkit.CheckLog(evs); err != nil {
			t.Errorf("execution %s: %v", id, err)
		}
		checkClaims(t, id, evs)
	}
	close(stop)
	readers.Wait()

	led.mu.Lock()
	for key, res := range led.acked {
		exec, step, _ := strings.Cut(key, "/")
		var s kernel.Step
		if _, err := testkit.Bearer(urls[1], testkit.AdminKey, "GET", "/v0/executions/"+exec+"/steps/"+step, nil, &s); err != nil {
			t.Errorf("acknowledged step %s: %v", key, err)
			continue
		}
		if s.Status != kernel.StepSucceeded || string(s.Result) != string(res) {
			t.Errorf("acknowledged step %s: %s %s, want succeeded %s", key, s.Status, s.Result, res)
		}
	}
	if len(led.after) > 0 {
		t.Errorf("effects ran again after their completion was acknowledged: %v", led.after)
	}
	acked := len(led.acked)
	led.mu.Unlock()
	mu.Lock()
	for k, c := range answers {
		f := strings.Fields(k)
		if f[1] != "503" && !(f[0] == "agent" && k == "agent 409 lease_superseded") {
			t.Errorf("%d answers %q: want only 503 unavailable while the database is down", c, k)
		}
	}
	t.Logf("%d steps acknowledged; answers other than 2xx: %v", acked, answers)
	mu.Unlock()
	st, err := postgres.Open(context.Background(), pg.dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Check(context.Background()); err != nil {
		t.Error(err)
	}
}
