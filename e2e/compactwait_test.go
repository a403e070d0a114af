package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// TestServeStartedDuringCompact: a kernel started while `wicket store
// compact` runs on its data directory finds the file locked and waits
// for the lock; compact renames the compacted copy over the file and
// exits, which lets the old file's lock go. The kernel must then serve
// the compacted file: before, it served the old one, unlinked, so that
// everything it acknowledged was gone at its next start (or, with the
// write-ahead log, it refused to start: "meta page 1 holds transaction
// 1, not N"). To order the events without timing, the test holds a
// shared lock of its own on the old file (compact's is shared too) from
// before the kernel opens it until compact has exited.
func TestServeStartedDuringCompact(t *testing.T) {
	for _, mode := range []string{"wal", "no-wal"} {
		t.Run(mode, func(t *testing.T) {
			var extra []string
			if mode == "no-wal" {
				extra = append(extra, "--no-wal")
			}
			dir, addr := t.TempDir(), freeAddr(t)
			path := filepath.Join(dir, "wicket.db")
			ctx := context.Background()
			admin := client.New("http://"+addr, client.WithAPIKey(testkit.AdminKey))
			p := startServe(t, dir, addr, extra...)
			if _, err := admin.PutAgent(ctx, wire.AgentRequest{ID: "before", Secret: "before-secret-0123456789"}); err != nil {
				t.Fatal(err)
			}
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			p.exited(t)

			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
				t.Fatal(err)
			}
			p, ready := spawnServe(t, dir, addr, extra...)
			defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
			p.waitOpening(t, path)
			if out, err := exec.Command(wicketBinary(t), "store", "compact", "--data", dir).CombinedOutput(); err != nil {
				t.Fatalf("store compact: %v\n%s", err, out)
			}
			if err := syscall.Flock(int(f.Fd()), syscall.LOCK_UN); err != nil {
				t.Fatal(err)
			}
			p.awaitReady(t, ready)
			if _, err := admin.PutAgent(ctx, wire.AgentRequest{ID: "after", Secret: "after-secret-0123456789"}); err != nil {
				t.Fatal(err)
			}
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			p.exited(t)

			p = startServe(t, dir, addr, extra...)
			for _, id := range []string{"before", "after"} {
				if _, err := admin.Agent(ctx, id); err != nil {
					t.Errorf("agent %s, put before the kernel stopped: %v", id, err)
				}
			}
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			p.exited(t)
		})
	}
}
