package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
)

// Hand-written hostile modules (plugins/wasm's rawModule, encoded):
//
//	bombWasm: wicket_evaluate grows memory to its cap in halving steps, then traps
//	loopWasm: wicket_evaluate loops forever
const (
	bombWasm = "0061736d0100000001150460017f017f60027f7f017e60000060027f7f017f03030200010503010001072b03066d656d6f727902000c7769636b65745f616c6c6f6300000f7769636b65745f6576616c7561746500010a2f0205004180080b2700418080042100024003402000450d0120004000417f460440200041017621000b0c000b0b000b"
	loopWasm = "0061736d0100000001150460017f017f60027f7f017e60000060027f7f017f03030200010503010001072b03066d656d6f727902000c7769636b65745f616c6c6f6300000f7769636b65745f6576616c7561746500010a100205004180080b080003400c000b000b"

	// rangeRego wants numbers.range of 2·10⁷ numbers: about 2 GB in OPA.
	rangeRego = "package wicket\ndecision := {\"decision\": \"deny\", \"reason\": sprintf(\"%d\", [count(numbers.range(1, 20000000))])}\n"
	// cubeRego is a 4000³ comprehension: minutes of CPU.
	cubeRego = "package wicket\nr := numbers.range(1, 4000)\ndecision := {\"decision\": \"deny\", \"reason\": sprintf(\"%d\", [count([x | some i in r; some j in r; some k in r; x := [i, j, k]])])}\n"
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// statusBytes reads a field of /proc/PID/status in bytes (0 if unreadable:
// a worker may exit while it is read).
func statusBytes(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n << 10
		}
	}
	return 0
}

// childrenRSS returns the summed VmRSS of pid's children (the Rego workers).
func childrenRSS(pid int) (sum int64, n int) {
	des, _ := os.ReadDir("/proc")
	for _, de := range des {
		child, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			sum += statusBytes(child, "VmRSS")
			n++
		}
	}
	return sum, n
}

// TestHostileTenantResources: a real `wicket serve` with the default
// ceilings, one tenant uploading the worst bundles they allow — wasm memory
// bombs up to the tenant's 512 MiB of wasm memory, a wasm busy loop, Rego
// that wants 2 GB and Rego that wants minutes — and evaluating them from 8
// clients at once for 10 s. Throughout, /v0/health answers, another
// tenant's steps are decided as usual, the kernel's peak RSS stays under
// 1.5 GiB (the tenant's 512 MiB of wasm memory, counted twice while an
// instance's memory grows, plus the kernel), and each Rego worker under its
// 256 MiB cap. Figures: docs/benchmarks.md.
func TestHostileTenantResources(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc (Linux) to read the kernel's memory")
	}
	dir, addr := t.TempDir(), freeAddr(t)
	p := startServe(t, dir, addr)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	pid := p.cmd.Process.Pid
	admin := func(method, path string, body, out any) error {
		_, err := testkit.Bearer(p.url, testkit.AdminKey, method, path, body, out)
		return err
	}
	for _, tenant := range []string{"hostile", "calm"} {
		if err := admin("POST", "/v0/tenants", map[string]any{"id": tenant}, nil); err != nil {
			t.Fatal(err)
		}
	}
	bundles := map[string][]byte{
		"bomb1": wasmArchive(t, "name: bomb1\nengine: wasm\nsandbox: {memory_pages: 1024}\n", mustHex(t, bombWasm)),
		"bomb2": wasmArchive(t, "name: bomb2\nengine: wasm\nsandbox: {memory_pages: 1024}\n", mustHex(t, bombWasm)),
		"bomb3": wasmArchive(t, "name: bomb3\nengine: wasm\nsandbox: {memory_pages: 1024}\n", mustHex(t, bombWasm)),
		"loop":  wasmArchive(t, "name: loop\nengine: wasm\nsandbox: {timeout: 2s}\n", mustHex(t, loopWasm)),
		"range": filesArchive(t, map[string]string{"bundle.yaml": "name: range\nengine: rego\n", "policy.rego": rangeRego}),
		"cube":  filesArchive(t, map[string]string{"bundle.yaml": "name: cube\nengine: rego\nsandbox: {timeout: 2s}\n", "policy.rego": cubeRego}),
	}
	var names []string
	for name, ar := range bundles {
		if _, err := uploadArchive(p.url, "hostile", name, ar); err != nil {
			t.Fatalf("upload %s: %v", name, err)
		}
		names = append(names, name)
		if err := admin("POST", "/v0/agents?tenant=hostile", map[string]any{"id": name, "webhook_url": "http://127.0.0.1:9/hook", "secret": "hostile-secret-0123456789", "bundle": name}, nil); err != nil {
			t.Fatal(err)
		}
	}
	// The tenant is at its wasm memory ceiling: one more bomb is refused.
	if st, err := uploadArchive(p.url, "hostile", "bomb4", wasmArchive(t, "name: bomb4\nengine: wasm\nsandbox: {memory_pages: 1024}\n", mustHex(t, bombWasm))); st != 400 || err == nil ||
		!strings.Contains(err.Error(), "per tenant (serve --wasm-tenant-memory)") {
		t.Fatalf("a fourth bomb: %d %v", st, err)
	}
	if err := admin("POST", "/v0/agents?tenant=calm", map[string]any{"id": "calm", "webhook_url": "http://127.0.0.1:9/hook", "secret": "calm-secret-0123456789"}, nil); err != nil {
		t.Fatal(err)
	}
	eval := func(ctx context.Context, tenant, agent string) (string, error) {
		var res struct{ Decision, RuleID, Reason string }
		_, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/policy/eval?tenant="+tenant,
			map[string]any{"agent_id": agent, "step": map[string]any{"kind": "tool_call", "target": "x"}}, &struct {
				Decision *string `json:"decision"`
				RuleID   *string `json:"rule_id"`
				Reason   *string `json:"reason"`
			}{&res.Decision, &res.RuleID, &res.Reason})
		return res.Decision + " " + res.RuleID + " " + res.Reason, err
	}
	baseline := statusBytes(pid, "VmRSS")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var hostileEvals, engineErrors atomic.Int64
	reasons := sync.Map{}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				name := names[(g+i)%len(names)]
				got, err := eval(context.Background(), "hostile", name)
				if err != nil {
					t.Errorf("eval %s: %v", name, err)
					return
				}
				hostileEvals.Add(1)
				if strings.HasPrefix(got, "deny engine_error ") {
					engineErrors.Add(1)
					reasons.Store(name, got)
				}
			}
		}()
	}
	var healthMax, calmMax time.Duration
	var healthN, calmN int
	var workersMax int64
	probe := &http.Client{Timeout: 5 * time.Second}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			start := time.Now()
			resp, err := probe.Get(p.url + "/v0/health")
			if err != nil || resp.StatusCode != 200 {
				t.Errorf("health: %v", err)
			} else {
				resp.Body.Close()
			}
			healthMax, healthN = max(healthMax, time.Since(start)), healthN+1
			start = time.Now()
			got, err := eval(context.Background(), "calm", "calm")
			if err != nil || !strings.HasPrefix(got, "allow ") {
				t.Errorf("calm tenant: %q %v", got, err)
			}
			calmMax, calmN = max(calmMax, time.Since(start)), calmN+1
			if rss, _ := childrenRSS(pid); rss > workersMax {
				workersMax = rss
			}
			time.Sleep(100 * time.Millisecond) // sampling period, not ordering
		}
	}()
	wg.Wait()

	peak := statusBytes(pid, "VmHWM")
	t.Logf("hostile evaluations: %d (%d engine_error); health: %d probes, slowest %s; calm tenant: %d decisions, slowest %s",
		hostileEvals.Load(), engineErrors.Load(), healthN, healthMax.Round(time.Millisecond), calmN, calmMax.Round(time.Millisecond))
	t.Logf("kernel RSS: %d MiB before the load, peak %d MiB; Rego workers: peak %d MiB in all", baseline>>20, peak>>20, workersMax>>20)
	for _, name := range names {
		if r, ok := reasons.Load(name); ok {
			t.Logf("%s: %s", name, r)
		} else {
			t.Errorf("%s was never denied engine_error", name)
		}
	}
	if peak > 1536<<20 {
		t.Errorf("kernel peak RSS %d MiB, want under 1536 MiB", peak>>20)
	}
	if _, n := childrenRSS(pid); n > 1 {
		t.Errorf("%d Rego workers for one tenant with Rego bundles, want at most 1", n)
	}
}
