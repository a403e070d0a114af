package bbolt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// filler sets every field of a value to a distinct non-zero value, so that
// a field the binary codec forgets (say, one added to kernel.Execution
// later) fails the round trip.
type filler struct{ n int }

func (f *filler) fill(t *testing.T, v reflect.Value, path string) {
	f.n++
	n := f.n
	switch {
	case v.Type() == reflect.TypeFor[time.Time]():
		v.Set(reflect.ValueOf(time.Unix(1_700_000_000+int64(n), int64(n)).UTC()))
		return
	case v.Type() == reflect.TypeFor[json.RawMessage]():
		v.SetBytes([]byte(fmt.Sprintf(`{"field":%q,"n":%d}`, path, n)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("%s-%d", path, n))
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(int64(n) * 1001)
	case reflect.Uint64, reflect.Uint32, reflect.Uint:
		v.SetUint(uint64(n) * 1003)
	case reflect.Float64:
		v.SetFloat(float64(n) + 0.25)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		f.fill(t, v.Elem(), path)
	case reflect.Struct:
		for i := range v.NumField() {
			f.fill(t, v.Field(i), path+"."+v.Type().Field(i).Name)
		}
	case reflect.Map:
		if v.Type() != reflect.TypeFor[map[string]string]() {
			t.Fatalf("%s: filler knows no %s", path, v.Type())
		}
		v.Set(reflect.ValueOf(map[string]string{path + "-a": "1", path + "-b": "2", "": ""}))
	default:
		t.Fatalf("%s: filler knows no %s (teach it, and the codec)", path, v.Type())
	}
}

func filled[T any](t *testing.T) *T {
	v := new(T)
	(&filler{}).fill(t, reflect.ValueOf(v).Elem(), reflect.TypeFor[T]().Name())
	return v
}

// roundTrip encodes v in binary and decodes it back.
func roundTrip[T any](t *testing.T, v *T) *T {
	t.Helper()
	raw, err := encode(v)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) < 2 || (raw[0] != formatBinary1 && raw[0] != formatBinary2 && raw[0] != formatBinary3) {
		t.Fatalf("%T is not stored in binary: %q", v, raw)
	}
	got, err := decode[T](raw)
	if err != nil {
		t.Fatalf("decode %T: %v", v, err)
	}
	// Decoding must not keep the stored bytes.
	clear(raw)
	return got
}

// roundTripStep encodes s in binary (format 3) and decodes it back, with
// its ids given as its key gives them; format 2 reads back the same.
func roundTripStep(t *testing.T, s *kernel.Step) *kernel.Step {
	t.Helper()
	raw := encodeStep(s)
	if len(raw) < 2 || raw[0] != formatBinary3 {
		t.Fatalf("step is not stored in format 3: %q", raw)
	}
	got, err := decodeStepAt(raw, s.Tenant, s.ExecutionID, s.ID)
	if err != nil {
		t.Fatalf("decode step: %v", err)
	}
	clear(raw)
	old, err := decodeStepAt(encodeStepV2(s), "ignored", "ignored", "ignored")
	if err != nil || !reflect.DeepEqual(old, got) {
		t.Fatalf("format 2 reads\n  %+v (%v)\nformat 3 reads\n  %+v", old, err, got)
	}
	return got
}

// roundTripEvent encodes ev in binary (format 3) and decodes it back,
// with its execution id and seq given as its key gives them.
func roundTripEvent(t *testing.T, ev *kernel.Event) *kernel.Event {
	t.Helper()
	raw := encodeEvent(ev)
	if len(raw) < 2 || raw[0] != formatBinary3 {
		t.Fatalf("event is not stored in format 3: %q", raw)
	}
	got := new(kernel.Event)
	if err := decodeEvent(raw, ev.ExecutionID, ev.Seq, got); err != nil {
		t.Fatalf("decode event: %v", err)
	}
	clear(raw)
	// Format 1 (schema 6 and before) reads back the same.
	old := new(kernel.Event)
	if err := decodeEvent(encodeEventV1(ev), "ignored", 99, old); err != nil || !reflect.DeepEqual(old, got) {
		t.Fatalf("format 1 reads\n  %+v (%v)\nformat 3 reads\n  %+v", old, err, got)
	}
	return got
}

// viaJSON is what the schema 1 (JSON) codec made of v.
func viaJSON[T any](t *testing.T, v *T) *T {
	t.Helper()
	raw, err := encodeJSON(v)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeV1[T](raw)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestCodecRoundTripsEveryField(t *testing.T) {
	check := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got  %+v\n want %+v", what, got, want)
		}
	}
	e := filled[kernel.Execution](t)
	check("Execution", roundTrip(t, e), e)
	s := filled[kernel.Step](t)
	check("Step", roundTripStep(t, s), s)
	ev := filled[kernel.Event](t)
	check("Event", roundTripEvent(t, ev), ev)
	o := filled[kernel.Occurrence](t)
	check("Occurrence", roundTrip(t, o), o)
	o.Lease.DispatchID = "01a2332b-7573-7000-8239-83a843f0455f"
	check("Occurrence (packed)", roundTrip(t, o), o)
	if old, err := decodeOccurrence(encodeOccurrenceV1(*o)); err != nil || old != *o {
		t.Errorf("Occurrence, format 1: %+v %v", old, err)
	}

	// Raw fields are independent: growing one does not write into the next.
	got := roundTrip(t, e)
	out := bytes.Clone(got.Output)
	_ = append(got.Input, "xxxxxxxxxxxxxxxx"...)
	if !bytes.Equal(got.Output, out) {
		t.Errorf("appending to Input changed Output: %s", got.Output)
	}
}

// TestCodecMatchesJSON: the binary codec reads back what the schema 1 JSON
// codec read back, for the values where the two could differ.
func TestCodecMatchesJSON(t *testing.T) {
	plus2 := time.FixedZone("", 2*3600)
	odd := time.FixedZone("", -(5*3600 + 30*60))
	times := []time.Time{
		{}, time.Unix(0, 0), time.Unix(0, 0).UTC(), time.Now(), time.Now().UTC(), time.Now().In(plus2),
		time.Now().In(odd), time.Date(1500, 2, 3, 4, 5, 6, 7, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999999, plus2),
		time.Date(1969, 12, 31, 23, 59, 59, 1, time.Local), time.Date(2025, 6, 1, 0, 0, 0, 0, time.Local),
	}
	// (An empty non-nil raw field is left out: the JSON codec refused it.)
	raws := []json.RawMessage{nil, json.RawMessage("null"), json.RawMessage(`{"a":[1,2.50,3e10],"h":"<b>&</b>"}`), json.RawMessage(`"\u00e9\u2028"`)}
	labels := []map[string]string{nil, {}, {"k": "v"}, {"b": "2", "a": "1", "": "empty"}}
	check := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: binary gives\n  %#v\nJSON gave\n  %#v", what, got, want)
		}
	}
	for i, tm := range times {
		tm := tm
		raw := raws[i%len(raws)]
		e := filled[kernel.Execution](t)
		e.CreatedAt, e.UpdatedAt, e.Dispatch.DueAt = tm, tm, tm
		e.Deadline = &tm
		e.Input, e.Output, e.Error = raw, raws[(i+1)%len(raws)], raws[(i+2)%len(raws)]
		e.Labels = labels[i%len(labels)]
		check(fmt.Sprintf("Execution %d", i), roundTrip(t, e), viaJSON(t, e))
		z := &kernel.Execution{CreatedAt: tm, Input: raw}
		check(fmt.Sprintf("zero Execution %d", i), roundTrip(t, z), viaJSON(t, z))

		s := filled[kernel.Step](t)
		s.CreatedAt, s.CompletedAt = tm, &tm
		s.Args, s.Result, s.Error = raw, raws[(i+1)%len(raws)], raws[(i+2)%len(raws)]
		s.Usage = &kernel.Usage{}
		s.Verdict = &kernel.StepVerdict{}
		check(fmt.Sprintf("Step %d", i), roundTripStep(t, s), viaJSON(t, s))
		zs := &kernel.Step{CreatedAt: tm, Args: raw}
		check(fmt.Sprintf("zero Step %d", i), roundTripStep(t, zs), viaJSON(t, zs))

		ev := &kernel.Event{ExecutionID: "e", Seq: uint64(i), Type: "t", Time: tm, Payload: raw}
		check(fmt.Sprintf("Event %d", i), roundTripEvent(t, ev), viaJSON(t, ev))
	}
	o := &kernel.Occurrence{}
	check("zero Occurrence", roundTrip(t, o), viaJSON(t, o))
}

// TestExecIndexMatches: the index fields PutExecution reads alone give the
// keys the whole record gives.
func TestExecIndexMatches(t *testing.T) {
	times := []time.Time{{}, time.Date(1500, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(1677, 9, 21, 0, 12, 43, 145224191, time.UTC),
		time.Unix(-1, 0), time.Unix(0, 1), time.Now(), time.Date(2262, 4, 11, 23, 47, 16, 854775808, time.UTC),
		time.Date(2500, 1, 1, 0, 0, 0, 0, time.FixedZone("", 3600)), time.Date(-50, 1, 1, 0, 0, 0, 0, time.UTC)}
	states := []kernel.DispatchStatus{kernel.DispatchNone, kernel.DispatchQueued, kernel.DispatchDelivering, kernel.DispatchAcked, kernel.DispatchParked}
	for i, tm := range times {
		for _, st := range states {
			e := &kernel.Execution{ID: "id-1", Tenant: "ten", IdempotencyKey: fmt.Sprint("k", i),
				Dispatch: kernel.DispatchState{State: st, DueAt: tm, LeaseUntil: tm.Add(time.Second)}}
			x, err := decodeExecIndex(encodeExecution(e))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(x.dueKey(), dueKey(e)) || !bytes.Equal(x.leaseKey(), leaseKey(e)) {
				t.Errorf("%v %q: index keys %q %q, want %q %q", tm, st, x.dueKey(), x.leaseKey(), dueKey(e), leaseKey(e))
			}
			if string(x.id) != e.ID || string(x.tenant) != e.Tenant || string(x.idemKey) != e.IdempotencyKey {
				t.Errorf("index fields %q %q %q", x.id, x.tenant, x.idemKey)
			}
		}
	}
}

// decodeAll runs every binary decoder on b; none may panic.
func decodeAll(b []byte) []error {
	_, err1 := decodeExecution(b)
	_, err2 := decodeExecIndex(b)
	_, err3 := decodeStep(b)
	var ev kernel.Event
	err4 := decodeEvent(b, "e", 1, &ev)
	_, err5 := decodeOccurrence(b)
	return []error{err1, err2, err3, err4, err5}
}

func codecSeeds(t testing.TB) [][]byte {
	tt, _ := t.(*testing.T)
	if tt == nil {
		tt = &testing.T{}
	}
	return [][]byte{
		encodeExecution(filled[kernel.Execution](tt)), encodeExecution(&kernel.Execution{}),
		encodeStep(filled[kernel.Step](tt)), encodeStep(&kernel.Step{}), encodeStepV2(filled[kernel.Step](tt)),
		encodeStep(benchStep()), encodeOccurrenceV1(*filled[kernel.Occurrence](tt)),
		encodeEvent(filled[kernel.Event](tt)), encodeOccurrence(*filled[kernel.Occurrence](tt)),
		encodeEventV1(filled[kernel.Event](tt)), encodeEvent(packableEvent()), encodeEvent(&kernel.Event{Type: "custom.type"}),
	}
}

// TestCodecRefusesDamage: every truncation of a record, and a record of
// another kind, is an error, never a panic nor a wrong value.
func TestCodecRefusesDamage(t *testing.T) {
	for _, rec := range codecSeeds(t) {
		for n := range len(rec) {
			errs := decodeAll(rec[:n])
			for i, err := range errs {
				if i == 1 { // the index reader reads a prefix only
					continue
				}
				if err == nil {
					t.Errorf("kind %q truncated to %d of %d bytes: decoder %d accepted it", rec[1], n, len(rec), i)
				}
			}
		}
		ok := 0
		for _, err := range decodeAll(rec) {
			if err == nil {
				ok++
			}
		}
		if want := map[byte]int{kindExecution: 2}[rec[1]]; ok != max(want, 1) {
			t.Errorf("kind %q: %d decoders accepted it", rec[1], ok)
		}
	}
	_, err := decodeExecution([]byte(`{"id":"x"}`))
	if err == nil || !strings.Contains(err.Error(), "JSON") {
		t.Errorf("a JSON record: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range codecSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		decodeAll(b)
		// What decodes re-encodes to the same value.
		if e, err := decodeExecution(b); err == nil {
			again, err := decodeExecution(encodeExecution(e))
			if err != nil || !reflect.DeepEqual(normalizeExec(again), normalizeExec(e)) {
				t.Fatalf("execution does not re-encode: %v\n%+v\n%+v", err, e, again)
			}
		}
		if s, err := decodeStep(b); err == nil {
			again, err := decodeStep(encodeStep(s))
			if err != nil || !reflect.DeepEqual(normalizeStep(again), normalizeStep(s)) {
				t.Fatalf("step does not re-encode: %v", err)
			}
		}
		var ev, again kernel.Event
		if err := decodeEvent(b, "e", 1, &ev); err == nil {
			ev.ExecutionID, ev.Seq = "e", 1 // what format 3 takes from the key
			ev.Payload = orNull(ev.Payload)
			err := decodeEvent(encodeEvent(&ev), "e", 1, &again)
			if err != nil || !reflect.DeepEqual(again, ev) {
				t.Fatalf("event does not re-encode: %v\n%+v\n%+v", err, ev, again)
			}
		}
	})
}

// normalizeExec and normalizeStep apply what encoding does to a decoded
// record: an empty non-omitempty raw field is stored as null.
func normalizeExec(e *kernel.Execution) *kernel.Execution {
	c := *e
	c.Input = orNull(c.Input)
	return &c
}

func normalizeStep(s *kernel.Step) *kernel.Step {
	c := *s
	c.Args = orNull(c.Args)
	c.Tenant, c.ExecutionID, c.ID = "", "", "" // format 3 leaves them to the key
	return &c
}

func TestMissingError(t *testing.T) {
	err := missing("step", "t", "e", "s")
	want := fmt.Errorf("bbolt: step %s/%s/%s: %w", "t", "e", "s", kernel.ErrNotFound)
	if err.Error() != want.Error() || !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("missing: %q (Is ErrNotFound: %v), want %q", err, errors.Is(err, kernel.ErrNotFound), want)
	}
}
