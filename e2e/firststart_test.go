package e2e

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestKillDuringTheFirstStart SIGKILLs `wicket serve` during its first
// start on an empty data directory, the instant anything appears in the
// directory, and starts it again: it must start. bbolt creates its file
// and only then writes the file's first pages; a kill in between left
// wicket.db empty, which the store refuses as damaged ("it is empty (0
// bytes), not a store"), so that the kernel never started again (about
// one kill in six landed there). The store is now created under a
// temporary name and linked into place once written.
func TestKillDuringTheFirstStart(t *testing.T) {
	const attempts = 30
	empty := 0
	for range attempts {
		dir := filepath.Join(t.TempDir(), "data")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		addr := freeAddr(t)
		p, _ := spawnServe(t, dir, addr)
		deadline := time.Now().Add(20 * time.Second)
		for {
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) > 0 {
				break
			}
			if time.Now().After(deadline) {
				_ = p.cmd.Process.Kill()
				t.Fatalf("nothing appeared in %s; kernel log:\n%s", dir, p.stderrString())
			}
		}
		p.kill(t, false)
		fi, err := os.Stat(filepath.Join(dir, "wicket.db"))
		if os.IsNotExist(err) {
			continue // killed before the file had its name: a first start again
		}
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() == 0 {
			empty++
		}
		p = startServe(t, dir, addr)
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		p.exited(t)
	}
	if empty > 0 {
		t.Errorf("%d of %d kills left an empty wicket.db", empty, attempts)
	}
}
