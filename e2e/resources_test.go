package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
)

// startWicket starts `wicket serve` through sh, so that it runs under
// `ulimit -n fdLimit`, with the admin key in a file. It returns the process
// (whose pid is wicket's: sh execs it).
func startWicket(t *testing.T, fdLimit int, extra ...string) *process {
	t.Helper()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "admin.key")
	if err := os.WriteFile(keyFile, []byte(testkit.AdminKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(dir, "ready")
	addr := freeAddr(t)
	args := []string{"serve", "--data", filepath.Join(dir, "data"), "--addr", addr, "--admin-key-file", keyFile,
		"--ready-file", ready, "--log-level", "warn"}
	args = append(args, extra...)
	script := fmt.Sprintf("ulimit -n %d && exec \"$0\" \"$@\"", fdLimit)
	cmd := exec.Command("sh", append([]string{"-c", script, wicketBinary(t)}, args...)...)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(ready); err == nil && len(b) > 0 {
			return &process{cmd: cmd, url: "http://" + addr, stderr: &stderr}
		}
		if time.Now().After(deadline) {
			t.Fatalf("wicket serve did not become ready: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procStatus reads a field of /proc/PID/status in KiB (VmRSS, VmHWM).
func procStatus(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read /proc status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				t.Fatalf("%s: %q", field, line)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// openFDs counts the open file descriptors of pid.
func openFDs(pid int) int {
	es, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(es)
}

// Figures of TestUnauthenticatedFloodCostsLittle (docs/benchmarks.md).
const (
	floodIdle     = 3000      // idle connections, three times the kernel's fd limit
	floodUploads  = 200       // stalled 32 MiB uploads, half without a key, half with a wrong one
	floodChunked  = 100       // stalled chunked bodies
	floodFDLimit  = 1024      // ulimit -n of the kernel
	floodMaxRSSKB = 150 << 10 // what the kernel's RSS must stay under
)

// TestUnauthenticatedFloodCostsLittle attacks a real `wicket serve`, with
// its limits at their defaults and `ulimit -n 1024`, as nobody at all:
// thousands of idle connections and hundreds of stalled uploads, held open
// together. /v0/health keeps answering within seconds, the kernel keeps its
// file descriptors and its RSS stays under a stated figure. Before, bodies
// were read before credentials (32 MiB a bundle upload) and idle
// connections took every file descriptor until accept failed.
func TestUnauthenticatedFloodCostsLittle(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < floodIdle+floodUploads+floodChunked+256 {
		t.Fatalf("this test holds %d connections and needs as many file descriptors; the limit is %d (%v)", floodIdle+floodUploads+floodChunked, lim.Cur, err)
	}
	p := startWicket(t, floodFDLimit)
	pid := p.cmd.Process.Pid
	addr := strings.TrimPrefix(p.url, "http://")
	baseRSS := procStatus(t, pid, "VmRSS")

	var mu sync.Mutex
	var conns []net.Conn
	hold := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	big := bytes.Repeat([]byte("x"), 64<<10)
	attack := func(i int) {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			return // the backlog is full: that is the attacker's problem
		}
		hold(c)
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		switch {
		case i < floodUploads/2:
			fmt.Fprintf(c, "PUT /v0/bundles/b%d HTTP/1.1\r\nHost: k\r\nContent-Type: application/gzip\r\nContent-Length: %d\r\n\r\n", i, 32<<20)
			_, _ = c.Write(big)
		case i < floodUploads:
			fmt.Fprintf(c, "PUT /v0/bundles/b%d HTTP/1.1\r\nHost: k\r\nAuthorization: Bearer wk_guess%d-0123456789\r\nContent-Type: application/gzip\r\nContent-Length: %d\r\n\r\n", i, i, 32<<20)
			_, _ = c.Write(big)
		case i < floodUploads+floodChunked:
			fmt.Fprintf(c, "POST /v0/executions HTTP/1.1\r\nHost: k\r\nTransfer-Encoding: chunked\r\n\r\n10000\r\n")
			_, _ = c.Write(big)
		case i%2 == 0:
			_, _ = io.WriteString(c, "GET /v0/health HTTP/1.1\r\nHost: k\r\n") // headers never end
		}
		// odd i past the uploads: connect and say nothing
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				attack(i)
			}
		}()
	}
	start := time.Now()
	go func() {
		for i := range floodUploads + floodChunked + floodIdle {
			work <- i
		}
		close(work)
	}()

	// While the attack runs and after, a newcomer is answered.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	health := func() error {
		res, err := hc.Get(p.url + "/v0/health")
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			return fmt.Errorf("status %d", res.StatusCode)
		}
		return nil
	}
	maxFDs := 0
	checks := 0
	for done := false; !done; {
		wgDone := make(chan struct{})
		go func() { wg.Wait(); close(wgDone) }()
		select {
		case <-wgDone:
			done = true
		case <-time.After(200 * time.Millisecond):
		}
		if err := health(); err != nil {
			t.Fatalf("health during the attack (%d connections held, %s in): %v", len(conns), time.Since(start).Round(time.Millisecond), err)
		}
		checks++
		maxFDs = max(maxFDs, openFDs(pid))
	}
	// Everything held at once, a while longer.
	for range 10 {
		if err := health(); err != nil {
			t.Fatalf("health with %d attacking connections held: %v", len(conns), err)
		}
		checks++
		maxFDs = max(maxFDs, openFDs(pid))
		time.Sleep(100 * time.Millisecond)
	}
	// The kernel still does real work for a real client.
	var x struct{ ID string }
	if st, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/tenants", map[string]any{"id": "acme"}, &x); st != 201 {
		t.Fatalf("an admin request during the attack: %d %v", st, err)
	}
	hwm := procStatus(t, pid, "VmHWM")
	t.Logf("attack: %d connections held (%d idle, %d stalled uploads, %d stalled chunked bodies) against ulimit -n %d; %d health checks answered; kernel fds at most %d; RSS %d KiB before, peak %d KiB",
		len(conns), floodIdle, floodUploads, floodChunked, floodFDLimit, checks, maxFDs, baseRSS, hwm)
	if hwm > floodMaxRSSKB {
		t.Errorf("kernel peak RSS %d KiB, want under %d KiB", hwm, floodMaxRSSKB)
	}
	if maxFDs >= floodFDLimit {
		t.Errorf("kernel used %d file descriptors, its limit is %d", maxFDs, floodFDLimit)
	}
}

// TestAdminKeyFile: `serve --admin-key-file` keeps the admin key off the
// command line (what ps shows any user) and authenticates with it.
func TestAdminKeyFile(t *testing.T) {
	p := startWicket(t, 4096)
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(cmdline, []byte("--admin-key-file")) || bytes.Contains(cmdline, []byte(testkit.AdminKey)) {
		t.Fatalf("command line %q: want --admin-key-file and not the key", bytes.ReplaceAll(cmdline, []byte{0}, []byte(" ")))
	}
	if st, err := testkit.Bearer(p.url, testkit.AdminKey, "GET", "/v0/tenants", nil, nil); st != 200 {
		t.Fatalf("the key from the file: %d %v", st, err)
	}
	if st, _ := testkit.Bearer(p.url, testkit.AdminKey+"x", "GET", "/v0/tenants", nil, nil); st != 401 {
		t.Fatalf("another key: %d, want 401", st)
	}
}
