package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchChildLoad runs `wicket bench` as a user does: the kernel in the
// bench's process, the load (agent and clients) in a child process of the
// same binary, so that the CPU figure is the kernel's alone.
func TestBenchChildLoad(t *testing.T) {
	prof := filepath.Join(t.TempDir(), "load.prof")
	out, err := exec.Command(wicketBinary(t), "bench", "--executions", "2", "--steps", "40", "--data", t.TempDir(),
		"--load-cpuprofile", prof).CombinedOutput()
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	for _, want := range []string{"40 over HTTP through sdk/agent, 2 concurrent executions, fsync true", "steps/s",
		"load CPU:", "(the agent and its HTTP clients, another process)", "server CPU:", "(kernel process:", "page writes/commit", "bytes per step",
		"load allocs:", "heap allocations per step"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("bench output lacks %q:\n%s", want, out)
		}
	}
	// --load-cpuprofile: the child wrote a profile of the load.
	if fi, err := os.Stat(prof); err != nil || fi.Size() == 0 {
		t.Errorf("load profile: %v", err)
	}
}
