package bbolt

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/storetest"
)

// benchOpen opens a store with fsync on, as in production, and remembers
// it so that the benchmark can report its commit statistics.
func benchOpen(s **Store, opts Options) func(b *testing.B) kernel.Store {
	return func(b *testing.B) kernel.Store {
		*s = openStore(b, opts, true)
		return *s
	}
}

// reportCommits reports how many Update functions shared a commit.
func reportCommits(b *testing.B, s *Store) {
	st := s.Stats()
	if st.Commits > 0 {
		b.ReportMetric(float64(st.Updates)/float64(st.Commits), "ops/commit")
	}
}

// BenchmarkUpdateSerial: one writer, one commit (two fsyncs) per submit.
func BenchmarkUpdateSerial(b *testing.B) {
	var s *Store
	storetest.BenchUpdateSerial(b, benchOpen(&s, Options{}))
	reportCommits(b, s)
}

// BenchmarkUpdateParallel: 8×GOMAXPROCS writers sharing commits.
func BenchmarkUpdateParallel(b *testing.B) {
	var s *Store
	b.SetParallelism(8)
	storetest.BenchUpdate(b, benchOpen(&s, Options{}))
	reportCommits(b, s)
}

// BenchmarkUpdateSerialNoSync is BenchmarkUpdateSerial without fsync: the
// CPU cost of the transaction itself.
func BenchmarkUpdateSerialNoSync(b *testing.B) {
	var s *Store
	storetest.BenchUpdateSerial(b, benchOpen(&s, Options{NoSync: true}))
	reportCommits(b, s)
}

// BenchmarkUpdateParallelNoSync is BenchmarkUpdateParallel without fsync.
func BenchmarkUpdateParallelNoSync(b *testing.B) {
	var s *Store
	b.SetParallelism(8)
	storetest.BenchUpdate(b, benchOpen(&s, Options{NoSync: true}))
	reportCommits(b, s)
}

// BenchmarkCodecExecution encodes and decodes an execution with a 1 KiB
// input in the binary form and in the schema 1 JSON form (the encoding
// before schema 2), and reads its index fields alone (PutExecution).
func BenchmarkCodecExecution(b *testing.B) {
	e := benchExec("0196a000-0000-7000-8000-000000000001")
	bin := encodeExecution(e)
	js, err := encodeJSON(e)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encode/binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			encodeExecution(e)
		}
		b.ReportMetric(float64(len(bin)), "bytes")
	})
	b.Run("encode/json-v1", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := encodeJSON(e); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(js)), "bytes")
	})
	b.Run("decode/binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeExecution(bin); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/json-v1", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeV1[kernel.Execution](js); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode-index/binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeExecIndex(bin); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCodecStep encodes and decodes a decided step, binary and JSON.
func BenchmarkCodecStep(b *testing.B) {
	now := time.Now().UTC()
	s := &kernel.Step{ID: strings.Repeat("a", 64), ExecutionID: "0196a000-0000-7000-8000-000000000001", Tenant: kernel.DefaultTenant,
		Kind: "tool_call", Target: "web.search", Args: json.RawMessage(`{"query":"durable execution kernels for AI agents","max_results":10}`),
		ArgsHash: strings.Repeat("b", 64), Idempotency: kernel.SafeToRetry, Status: kernel.StepSucceeded, Result: json.RawMessage(`{"hits":["a","b"]}`),
		Lease:   kernel.Lease{DispatchID: "0196a000-0000-7000-8000-00000000d001", Attempt: 1},
		Verdict: &kernel.StepVerdict{Action: "allow", RuleID: "allow-search", EvalTime: time.Microsecond}, Seq: 4, CreatedAt: now, CompletedAt: &now}
	bin := encodeStep(s)
	js, err := encodeJSON(s)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encode/binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			encodeStep(s)
		}
	})
	b.Run("encode/binary-format2", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			encodeStepV2(s)
		}
	})
	b.Run("decode/binary-format2", func(b *testing.B) {
		v2 := encodeStepV2(s)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeStep(v2); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode/json-v1", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := encodeJSON(s); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeStep(bin); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/json-v1", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeV1[kernel.Step](js); err != nil {
				b.Fatal(err)
			}
		}
	})
}
