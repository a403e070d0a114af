package wasm

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/wicket-run/wicket/plugins/bundle"
)

// Grants a manifest may list under sandbox.grants.
const (
	// GrantClock gives the module the host's wall clock, monotonic clock and sleep.
	GrantClock = "clock"
	// GrantRandom makes random_get read crypto/rand instead of a fixed seed.
	GrantRandom = "random"
	// GrantEnv exposes Config.Env as environment variables.
	GrantEnv = "env"
	// GrantStdout sends module stdout and stderr to Config.Logger.
	GrantStdout = "stdout"
)

// wasiModule is the only host module a Wicket-ABI module may import from.
const wasiModule = "wasi_snapshot_preview1"

// sandbox is a bundle's effective sandbox: manifest values with engine
// defaults applied.
type sandbox struct {
	abi     string
	pages   uint32
	pool    int
	timeout time.Duration
	// startTimeout bounds instantiation: the start section, _initialize
	// and, for OPA modules, loading data.json.
	startTimeout time.Duration
	grants       map[string]bool
}

func (s *sandbox) granted(g string) bool { return s.grants[g] }

// sandboxFor validates the manifest's ABI and sandbox section.
func (e *Engine) sandboxFor(m *bundle.Manifest) (*sandbox, error) {
	eff, err := e.cfg.Limits.Apply(m)
	if err != nil {
		return nil, fmt.Errorf("wasm: %w", err)
	}
	s := &sandbox{abi: m.ABI, pages: eff.MemoryPages, pool: eff.PoolSize, timeout: eff.Timeout, startTimeout: eff.StartTimeout, grants: map[string]bool{}}
	switch s.abi {
	case "":
		s.abi = bundle.ABIWicket
	case bundle.ABIWicket, bundle.ABIOPA:
	default:
		return nil, fmt.Errorf("wasm: unknown abi %q (want %q or %q)", m.ABI, bundle.ABIWicket, bundle.ABIOPA)
	}
	for _, g := range m.Sandbox.Grants {
		switch g {
		case GrantClock, GrantRandom, GrantEnv, GrantStdout:
			s.grants[g] = true
		default:
			return nil, fmt.Errorf("wasm: unknown sandbox grant %q (known: clock, random, env, stdout)", g)
		}
	}
	return s, nil
}

// moduleConfig returns the WASI configuration for one instance. stdout and
// stderr are the instance's writers.
func (e *Engine) moduleConfig(s *sandbox, stdout, stderr io.Writer) wazero.ModuleConfig {
	// wazero's defaults already grant nothing: no args, env or preopens, an
	// empty stdin, a fake clock that advances 1ms per read, no-op sleep and a
	// fixed-seed random source. Spell out what the grants change.
	mc := wazero.NewModuleConfig().
		WithName(""). // anonymous: many instances of one module may coexist
		WithStartFunctions("_initialize").
		WithStdout(stdout).
		WithStderr(stderr)
	if s.granted(GrantClock) {
		mc = mc.WithSysWalltime().WithSysNanotime().WithSysNanosleep()
	}
	if s.granted(GrantRandom) {
		mc = mc.WithRandSource(rand.Reader)
	}
	if s.granted(GrantEnv) {
		keys := make([]string, 0, len(e.cfg.Env))
		for k := range e.cfg.Env {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			mc = mc.WithEnv(k, e.cfg.Env[k])
		}
	}
	return mc
}

// outputs are one instance's stdout and stderr writers. stderr always keeps
// a short tail for error reasons; both reach the log only with the stdout
// grant.
type outputs struct {
	stdout io.Writer
	stderr *tailWriter
}

func (e *Engine) newOutputs(s *sandbox, name, revision string) *outputs {
	o := &outputs{stdout: io.Discard, stderr: &tailWriter{}}
	if s.granted(GrantStdout) {
		log := e.cfg.Logger.With("bundle", name, "revision", revision)
		o.stdout = &lineLogger{log: log, stream: "stdout"}
		o.stderr.next = &lineLogger{log: log, stream: "stderr"}
	}
	return o
}

// tailWriter captures the start and the end of what a module writes to
// stderr during one evaluation (for error reasons) and forwards everything
// to next, if set.
type tailWriter struct {
	mu         sync.Mutex
	head, tail []byte
	next       io.Writer
}

const captureKeep = 2048

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	if n := captureKeep - len(w.head); n > 0 {
		w.head = append(w.head, p[:min(n, len(p))]...)
	}
	w.tail = append(w.tail, p...)
	if len(w.tail) > captureKeep {
		w.tail = append(w.tail[:0], w.tail[len(w.tail)-captureKeep:]...)
	}
	w.mu.Unlock()
	if w.next != nil {
		_, _ = w.next.Write(p)
	}
	return len(p), nil
}

// reset forgets what was written.
func (w *tailWriter) reset() {
	w.mu.Lock()
	w.head, w.tail = w.head[:0], w.tail[:0]
	w.mu.Unlock()
}

// summary returns the line of stderr that best explains a crash, at most
// 200 bytes with control characters removed: the first "fatal error:" or
// "panic:" line (Go's runtime prints a stack trace after it), else the last
// non-empty line.
func (w *tailWriter) summary() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range strings.Split(string(w.head), "\n") {
		if strings.HasPrefix(l, "fatal error:") || strings.HasPrefix(l, "panic:") {
			return cleanLine(l)
		}
	}
	lines := strings.Split(string(w.tail), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := cleanLine(lines[i]); l != "" {
			return l
		}
	}
	return ""
}

func cleanLine(l string) string {
	l = strings.TrimSpace(strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, l))
	if len(l) > 200 {
		l = l[:200] + "…"
	}
	return l
}

// lineLogger writes each complete line as one log record.
type lineLogger struct {
	log    *slog.Logger
	stream string
	buf    []byte
}

const maxLogLine = 4096

func (l *lineLogger) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			if len(l.buf) >= maxLogLine {
				l.emit(l.buf[:maxLogLine])
				l.buf = append(l.buf[:0], l.buf[maxLogLine:]...)
				continue
			}
			return len(p), nil
		}
		l.emit(l.buf[:i])
		l.buf = append(l.buf[:0], l.buf[i+1:]...)
	}
}

func (l *lineLogger) emit(line []byte) {
	l.log.LogAttrs(context.Background(), slog.LevelInfo, "wasm policy output",
		slog.String("stream", l.stream), slog.String("line", string(line)))
}
