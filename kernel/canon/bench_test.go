package canon

import "testing"

// benchArgs is a realistic tool-call args object of about 500 bytes:
// unsorted keys, nesting, an array, numbers, escapes, non-ASCII text and
// pretty-printing whitespace.
const benchArgs = `{
  "query": "durable execution for AI agents: replay, leases & approvals",
  "max_results": 10,
  "include_domains": ["go.dev", "github.com", "arxiv.org"],
  "exclude_domains": [],
  "time_range": {"to": "2025-06-30T23:59:59Z", "from": "2024-01-01T00:00:00Z"},
  "search_depth": "advanced",
  "safe_search": true,
  "temperature": 0.7,
  "region": "de-DE",
  "user_note": "Zusammenfassung auf Deutsch, bitte \"kurz\" halten — max. 5 Punkte.\n",
  "session": {"retries": 0, "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "parent": null}
}`

func BenchmarkCanonical(b *testing.B) {
	in := []byte(benchArgs)
	if _, err := Canonical(in); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Canonical(in); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkArgsHash(b *testing.B) {
	in := []byte(benchArgs)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ArgsHash(in); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkStepID(b *testing.B) {
	const argsHash = "0e7a33c855cdb9ca5e9512f4c4d628546ef12a44e081306b23bfcc4cc3401459"
	b.ReportAllocs()
	for b.Loop() {
		StepID("0190a5f2-7c3e-7b4a-9d2e-1f2a3b4c5d6e", "tool_call", "web_search", argsHash, 3)
	}
}

// BenchmarkEncodingJSONBaseline is the obvious alternative for comparison:
// decode with UseNumber into any and re-marshal (which, unlike Canonical,
// accepts duplicate keys, invalid UTF-8 and lone surrogates).
func BenchmarkEncodingJSONBaseline(b *testing.B) {
	in := []byte(benchArgs)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := viaEncodingJSON(in); err != nil {
			b.Fatal(err)
		}
	}
}
