package bbolt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/store/storecopy"
)

// encodeEventV1 is the event encoder of schemas 2 to 6 (format 1), frozen
// here to write files of those schemas: the execution id and seq in the
// head, the type spelled out, the payload as it is.
func encodeEventV1(ev *kernel.Event) []byte {
	payload := orNull(ev.Payload)
	b := header(formatBinary1, kindEvent, 32+len(ev.ExecutionID)+len(ev.Type), payload)
	b = appendStr(b, ev.ExecutionID)
	b = appendUint(b, ev.Seq)
	b = appendStr(b, string(ev.Type))
	b = appendTime(b, ev.Time)
	return append(b, payload...)
}

// encodeStepV2 is the step encoder of schemas 5 and 6 (format 2), frozen
// here to write files of those schemas: the ids in the head, strings as
// they are.
func encodeStepV2(s *kernel.Step) []byte {
	args := orNull(s.Args)
	b := header(formatBinary2, kindStep, 256, args, s.Result, s.Error)
	b = appendStr(b, s.ID)
	b = appendStr(b, s.ExecutionID)
	b = appendStr(b, s.Tenant)
	b = appendStr(b, s.Kind)
	b = appendStr(b, s.Target)
	b = appendStr(b, s.ArgsHash)
	b = appendInt(b, int64(s.Occurrence))
	b = appendStr(b, string(s.Idempotency))
	b = appendStr(b, s.Effect)
	b = appendStr(b, string(s.Status))
	b = appendBool(b, s.Usage != nil)
	if u := s.Usage; u != nil {
		b = appendInt(b, u.InputTokens)
		b = appendInt(b, u.OutputTokens)
		b = appendInt(b, u.TotalTokens)
		b = appendFloat(b, u.CostUSD)
	}
	b = appendStr(b, s.Lease.DispatchID)
	b = appendInt(b, int64(s.Lease.Attempt))
	b = appendBool(b, s.Verdict != nil)
	if d := s.Verdict; d != nil {
		b = appendStr(b, string(d.Action))
		b = appendStr(b, d.Reason)
		b = appendStr(b, d.RuleID)
		b = appendStr(b, d.Bundle.Name)
		b = appendStr(b, d.Bundle.Revision)
		b = appendStr(b, d.Bundle.Digest)
		b = appendStr(b, d.Bundle.Engine)
		b = appendInt(b, int64(d.EvalTime))
	}
	b = appendStr(b, s.ApprovalID)
	b = appendUint(b, s.Seq)
	b = appendTime(b, s.CreatedAt)
	b = appendOptTime(b, s.CompletedAt)
	b = appendStr(b, s.OnInterrupted)
	b = append(b, args...)
	b = append(b, s.Result...)
	return append(b, s.Error...)
}

// encodeOccurrenceV1 is the occurrence encoder of schemas 2 to 6
// (format 1), frozen here to write files of those schemas.
func encodeOccurrenceV1(o kernel.Occurrence) []byte {
	b := []byte{formatBinary1, kindOccurrence}
	b = appendStr(b, o.Lease.DispatchID)
	b = appendInt(b, int64(o.Lease.Attempt))
	return appendInt(b, int64(o.Count))
}

// The payloads of a step's events as the kernel writes them (bench-like
// values).
var stepPayloads = []string{
	`{"step_id":"03742785c778d5c19d35e3384505ae676df19c355de1c50b8b93284994c67a50","kind":"tool_call","target":"search","args_hash":"69dea38c6ebe061b25d73fd9ac3e934d7c2fe0639cf840f0628c4f221dae76f0","occurrence":0,"idempotency":"at_most_once","effect":"","dispatch_id":"01a2332b-7573-7000-8239-83a843f0455f","dispatch_attempt":1}`,
	`{"step_id":"03742785c778d5c19d35e3384505ae676df19c355de1c50b8b93284994c67a50","kind":"tool_call","target":"search","decision":"allow","reason":"kernel default policy: allow","rule_id":"kernel_default","bundle":{"name":"kernel-default","revision":"1","sha256":"","engine":"builtin"},"engine":"builtin","eval_ns":1674}`,
	`{"step_id":"03742785c778d5c19d35e3384505ae676df19c355de1c50b8b93284994c67a50","kind":"tool_call","target":"search","dispatch_id":"01a2332b-7573-7000-8239-83a843f0455f","dispatch_attempt":1}`,
	`{"step_id":"03742785c778d5c19d35e3384505ae676df19c355de1c50b8b93284994c67a50","kind":"tool_call","target":"search"}`,
}

// benchStep is a step as `wicket bench` leaves it: a tool call allowed by
// the kernel's default policy, succeeded.
func benchStep() *kernel.Step {
	t0 := time.Date(2026, 12, 1, 19, 55, 5, 859038212, time.UTC)
	t1 := t0.Add(3 * time.Millisecond)
	return &kernel.Step{ID: "03742785c778d5c19d35e3384505ae676df19c355de1c50b8b93284994c67a50",
		ExecutionID: "01a2332b-7572-7000-b0c5-27b27387cdf8", Tenant: kernel.DefaultTenant, Kind: "tool_call", Target: "search",
		Args: json.RawMessage(`{"n":1,"q":"bench"}`), ArgsHash: "69dea38c6ebe061b25d73fd9ac3e934d7c2fe0639cf840f0628c4f221dae76f0",
		Idempotency: kernel.AtMostOnce, Status: kernel.StepSucceeded, Result: json.RawMessage(`{"n":1}`),
		Lease: kernel.Lease{DispatchID: "01a2332b-7573-7000-8239-83a843f0455f", Attempt: 1},
		Verdict: &kernel.StepVerdict{Action: "allow", Reason: "kernel default policy: allow", RuleID: "kernel_default",
			Bundle: policy.BundleRef{Name: "kernel-default", Revision: "1", Engine: "builtin"}, EvalTime: 1674},
		Seq: 6, CreatedAt: t0, CompletedAt: &t1}
}

func packableEvent() *kernel.Event {
	return &kernel.Event{ExecutionID: "01a2332b-7572-7000-b0c5-27b27387cdf8", Seq: 6, Type: kernel.EvStepProposed,
		Time: time.Date(2026, 12, 1, 19, 55, 5, 859038212, time.UTC), Payload: json.RawMessage(stepPayloads[0])}
}

// TestPackJSON: packing gives back exactly the bytes packed, for the
// kernel's payloads (packed much shorter) and for near misses of every
// rule (uppercase hex, short runs, UUIDs out of shape, words cut short),
// and leaves alone what holds a control byte or would not shrink.
func TestPackJSON(t *testing.T) {
	hex64 := strings.Repeat("0123456789abcdef", 4)
	cases := []string{
		`{}`, `null`, `""`, `"`, `{"a":1}`, `"é☃\u2028"`, "\x7f\xff\xfe",
		`"` + hex64 + `"`, `"` + strings.ToUpper(hex64) + `"`, `"` + hex64[:63] + `"`, `"` + hex64 + hex64 + `"`,
		`"` + hex64 + `x"`, hex64, `"` + hex64 + hex64[:10] + `"`,
		`"01a2332b-7573-7000-8239-83a843f0455f"`, `"01A2332B-7573-7000-8239-83a843f0455f"`,
		`"01a2332b-7573-7000-8239-83a843f0455"`, `"01a2332b+7573-7000-8239-83a843f0455f"`, `"01a2332b-7573-7000-8239-83a843f0455fff"`,
		`{"step_id":"`, `{"step_id":`, `","kind":"`, `tool_cal`, `tool_calls`, `{"dispatch_attempt":1,"dispatch_id":"x"}`,
		`{"agent_id":"a","agent_version":"","labels":null,"limits":{}}`,
		`{"step_id":"s","kind":"tool_call","target":"t","error":{"code":"x","message":"y"},"usage":{"input_tokens":1,"output_tokens":2,"total_tokens":3,"cost_usd":0.5}}`,
	}
	cases = append(cases, stepPayloads...)
	for _, c := range cases {
		p, ok := packJSON(nil, []byte(c), false)
		if !ok {
			if len(p) != 0 {
				t.Errorf("%q: not packed but %d bytes written", c, len(p))
			}
			continue
		}
		if len(p) >= len(c) {
			t.Errorf("%q: packed to %d bytes, not shorter", c, len(p))
		}
		n, err := unpackedLen(p)
		if err != nil || n != len(c) {
			t.Errorf("%q: unpackedLen %d %v", c, n, err)
			continue
		}
		if got := string(unpackJSON(nil, p)); got != c {
			t.Errorf("round trip:\n got  %q\n want %q", got, c)
		}
	}
	// The kernel's step payloads shrink to well under half.
	total, packed := 0, 0
	for _, c := range stepPayloads {
		p, ok := packJSON(nil, []byte(c), false)
		if !ok {
			t.Fatalf("%q: not packed", c)
		}
		total, packed = total+len(c), packed+len(p)
	}
	if packed*3 > total {
		t.Errorf("step payloads: %d bytes packed to %d, want a third at most", total, packed)
	}
	for _, c := range []string{"{\"a\":\n1}", "\x00", "\t\"" + hex64 + "\""} {
		if p, ok := packJSON([]byte("pre"), []byte(c), false); ok || string(p) != "pre" {
			t.Errorf("%q holds a control byte: packed (%v) to %q", c, ok, p)
		}
	}
	for _, bad := range []string{"\x00", "\x1d", "\x1c", "\x1c\xff", "\x1e" + "short", "\x1f" + "short"} {
		if _, err := unpackedLen([]byte(bad)); err == nil {
			t.Errorf("unpackedLen accepted %q", bad)
		}
	}
}

func FuzzPackJSON(f *testing.F) {
	for _, p := range stepPayloads {
		f.Add([]byte(p))
	}
	f.Add([]byte(`"01a2332b-7573-7000-8239-83a843f0455f"`))
	f.Add([]byte("\x1e\x1f\x1c"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if p, ok := packJSON(nil, b, false); ok {
			if n, err := unpackedLen(p); err != nil || n != len(b) {
				t.Fatalf("unpackedLen %d %v, want %d", n, err, len(b))
			}
			if got := unpackJSON(nil, p); !bytes.Equal(got, b) {
				t.Fatalf("round trip: %q, want %q", got, b)
			}
		}
		if n, err := unpackedLen(b); err == nil {
			if got := unpackJSON(nil, b); len(got) != n {
				t.Fatalf("unpackJSON gave %d bytes, unpackedLen %d", len(got), n)
			}
		}
	})
}

// TestEventFormat3 checks what the format saves and that every field
// reads back: known and unknown types, packed and unpacked payloads.
func TestEventFormat3(t *testing.T) {
	for i, p := range append(stepPayloads, "", "null", `{"x":"\u0000"}`, "\"\x01\"") {
		for _, typ := range []kernel.EventType{kernel.EvStepProposed, "custom.type"} {
			ev := packableEvent()
			ev.Type, ev.Seq = typ, uint64(i+1)
			ev.Payload = json.RawMessage(p)
			got := roundTripEvent(t, ev)
			want := *ev
			want.Payload = orNull(ev.Payload)
			if !reflect.DeepEqual(got, &want) {
				t.Errorf("%q %s:\n got  %+v\n want %+v", p, typ, got, &want)
			}
		}
	}
	ev := packableEvent()
	v1, v3 := encodeEventV1(ev), encodeEvent(ev)
	if len(v3)*2 > len(v1) {
		t.Errorf("step.proposed: format 3 takes %d bytes, format 1 %d: want half at most", len(v3), len(v1))
	}
	st := benchStep()
	if v2, v3 := encodeStepV2(st), encodeStep(st); len(v3)*2 > len(v2) {
		t.Errorf("step record: format 3 takes %d bytes, format 2 %d: want half at most", len(v3), len(v2))
	}
	for _, typ := range eventTypes {
		if eventTypeCodes[typ] == 0 || eventTypes[eventTypeCodes[typ]-1] != typ {
			t.Errorf("type %s has no code", typ)
		}
	}
}

// TestMigrateEventFormat3 opens a schema 6 file whose events are format 1
// (written by a kernel, then turned back into format 1 as a schema 6
// binary stored them): the events read back as they were, new events are
// format 3, the log with both reads in order, and check, export and a
// backup follow.
func TestMigrateEventFormat3(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	e := &kernel.Execution{ID: "e1", Tenant: "t", AgentID: "a", Status: kernel.ExecRunning, CreatedAt: t0, UpdatedAt: t0}
	const n = 200
	var want []kernel.Event
	err = s.Update(ctx, func(tx kernel.Tx) error {
		for i := range n {
			typ := kernel.EvStepProposed
			if i == 0 {
				typ = kernel.EvExecutionCreated
			}
			if i%7 == 3 {
				typ = "custom.type"
			}
			ev := kernel.Event{ExecutionID: "e1", Seq: uint64(i + 1), Type: typ, Time: t0.Add(time.Duration(i)),
				Payload: json.RawMessage(strings.Replace(stepPayloads[i%len(stepPayloads)], "03742785", fmt.Sprintf("%08x", i), 1))}
			if err := tx.AppendEvent("t", ev); err != nil {
				return err
			}
			want = append(want, ev)
		}
		e.LastSeq = n
		return tx.PutExecution(e)
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	// Back to schema 6: every event in format 1.
	db, err := bolt.Open(path, FileMode, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bEvents)
		for i := range want {
			k := eventKey("t", "e1", want[i].Seq)
			if v := b.Get(k); len(v) == 0 || v[0] != formatBinary3 {
				return fmt.Errorf("event %d not format 3: %q", i, v)
			}
			if err := b.Put(k, encodeEventV1(&want[i])); err != nil {
				return err
			}
		}
		return tx.Bucket(bMeta).Put(keySchemaVersion, []byte{0, 0, 0, 0, 0, 0, 0, 6})
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	s, err = Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v := fileSchema(t, s); v != SchemaVersion || SchemaVersion != 7 {
		t.Fatalf("schema %d after Open, want 7", v)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	// More events, format 3, after the old ones.
	err = s.Update(ctx, func(tx kernel.Tx) error {
		for i := n; i < n+20; i++ {
			ev := kernel.Event{ExecutionID: "e1", Seq: uint64(i + 1), Type: kernel.EvStepSucceeded, Time: t0,
				Payload: json.RawMessage(strings.Replace(stepPayloads[3], "03742785", fmt.Sprintf("%08x", i), 1))}
			if err := tx.AppendEvent("t", ev); err != nil {
				return err
			}
			want = append(want, ev)
		}
		e.LastSeq = n + 20
		return tx.PutExecution(e)
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.View(ctx, func(tx kernel.ReadTx) error {
		got, err := tx.Events("t", "e1", 0, 0)
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("events: got %d, want %d; first difference at %d", len(got), len(want), firstDiff(got, want))
		}
		tail, err := tx.Events("t", "e1", n-1, 3)
		if err != nil || len(tail) != 3 || tail[0].Seq != n || tail[2].Seq != n+2 {
			return fmt.Errorf("events after %d: %+v %v", n-1, tail, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	var exported []kernel.Event
	err = s.Export(ctx, func(r storecopy.Record) error {
		if r.Event != nil {
			exported = append(exported, r.Event.Event)
		}
		return nil
	})
	if err != nil || !reflect.DeepEqual(exported, want) {
		t.Fatalf("export: %d events (%v), want %d; first difference at %d", len(exported), err, len(want), firstDiff(exported, want))
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		old := tx.Bucket(bEvents).Get(eventKey("t", "e1", 1))
		young := tx.Bucket(bEvents).Get(eventKey("t", "e1", n+1))
		if old[0] != formatBinary1 || young[0] != formatBinary3 {
			return fmt.Errorf("formats %d and %d, want 1 (left as stored) and 3", old[0], young[0])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func firstDiff(a, b []kernel.Event) int {
	for i := range min(len(a), len(b)) {
		if !reflect.DeepEqual(a[i], b[i]) {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestDecodeFormat3Damage: the parts of a format 3 record that are not a
// length (an event's flags and type code, a packed payload, a packed
// string) are checked too: a damaged one is an error, never a panic nor a
// wrong value.
func TestDecodeFormat3Damage(t *testing.T) {
	event := func(flags, code uint64, blob ...byte) []byte {
		b := []byte{formatBinary3, kindEvent}
		b = appendUint(b, uint64(len(blob)))
		b = appendUint(b, flags)
		b = appendUint(b, code)
		b = appendTime(b, time.Unix(0, 0))
		return append(b, blob...)
	}
	var ev kernel.Event
	if err := decodeEvent(event(1, 1, 0x01), "e", 1, &ev); err != nil || string(ev.Payload) != packWords[0] {
		t.Fatalf("a well-formed record: %v, payload %q", err, ev.Payload)
	}
	for name, rec := range map[string][]byte{
		"flags 2":             event(2, 1, '{', '}'),
		"unknown type code":   event(0, uint64(len(eventTypes))+1, '{', '}'),
		"token 0":             event(1, 1, 0x00),
		"token 0x1d":          event(1, 1, '{', 0x1d),
		"unknown ext word":    event(1, 1, packExt, byte(len(packWordsExt))),
		"ext token cut short": event(1, 1, packExt),
		"hex cut short":       event(1, 1, packHex, 1, 2, 3),
		"UUID cut short":      event(1, 1, packUUID, 1, 2, 3),
	} {
		ev = kernel.Event{}
		if err := decodeEvent(rec, "e", 1, &ev); !errors.Is(err, errMalformed) {
			t.Errorf("event, %s: %v (%+v), want errMalformed", name, err, ev)
		}
	}
	// A step's packed string (its kind, a lone word): a token the tables
	// do not have.
	for name, tc := range map[string]struct {
		kind string
		tok  []byte // the packed string as encoded
		bad  []byte // what replaces it
	}{
		"token 0":          {"tool_call", []byte{3, 0x14}, []byte{3, 0x00}},
		"token 0x1d":       {"tool_call", []byte{3, 0x14}, []byte{3, 0x1d}},
		"unknown ext word": {"succeeded", []byte{5, packExt, 24}, []byte{5, packExt, 0xff}},
	} {
		rec := encodeStep(&kernel.Step{Kind: tc.kind})
		i := bytes.Index(rec, tc.tok)
		if i < 0 {
			t.Fatalf("step, %s: %x not in %x", name, tc.tok, rec)
		}
		copy(rec[i:], tc.bad)
		if s, err := decodeStep(rec); !errors.Is(err, errMalformed) {
			t.Errorf("step, %s: %v (%+v), want errMalformed", name, err, s)
		}
	}
}
