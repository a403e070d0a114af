package canon

import (
	"errors"
	"strings"
	"sync"
	"testing"
)

func TestErrors(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	tests := []struct {
		name   string
		in     string
		kind   error
		offset int
		msg    string // the full message
	}{
		{"empty", "", ErrSyntax, 0,
			"canon: invalid JSON: unexpected end of input looking for beginning of value at byte offset 0"},
		{"bad_start", " x", ErrSyntax, 1,
			"canon: invalid JSON: unexpected 'x' looking for beginning of value at byte offset 1"},
		{"control_byte_reported_as_hex", "\x01", ErrSyntax, 0,
			"canon: invalid JSON: unexpected byte 0x01 looking for beginning of value at byte offset 0"},
		{"object_key", `{"a":1, 2}`, ErrSyntax, 8,
			"canon: invalid JSON: unexpected '2' looking for beginning of object key string at byte offset 8"},
		{"array_sep", `[1;2]`, ErrSyntax, 2,
			"canon: invalid JSON: unexpected ';' after array element (expecting ',' or ']') at byte offset 2"},
		{"object_sep", `{"a":1]`, ErrSyntax, 6,
			"canon: invalid JSON: unexpected ']' after object member (expecting ',' or '}') at byte offset 6"},
		{"eof_in_string", `["ab`, ErrSyntax, 4,
			"canon: invalid JSON: unexpected end of input in string literal at byte offset 4"},
		{"raw_control", "\"a\x1fb\"", ErrSyntax, 2,
			"canon: invalid JSON: unescaped control character byte 0x1f in string literal at byte offset 2"},
		{"bad_escape", `"a\q"`, ErrSyntax, 3,
			"canon: invalid JSON: unexpected 'q' in string escape at byte offset 3"},
		{"bad_hex", `"\u00g0"`, ErrSyntax, 5,
			`canon: invalid JSON: unexpected 'g' in \u escape (expecting a hex digit) at byte offset 5`},
		{"leading_zero", `[-012]`, ErrSyntax, 3,
			"canon: invalid JSON: invalid number literal: leading zero at byte offset 3"},
		{"trailing", `{} x`, ErrTrailingData, 3,
			"canon: trailing data after top-level value: unexpected 'x' at byte offset 3"},
		{"trailing_number", `1 2`, ErrTrailingData, 2,
			"canon: trailing data after top-level value: unexpected '2' at byte offset 2"},
		{"too_deep", deep(MaxDepth + 1), ErrTooDeep, MaxDepth,
			"canon: nesting too deep: more than 256 levels at byte offset 256"},
		{"too_deep_mixed", strings.Repeat(`{"a":[`, 200) + "0" + strings.Repeat("]}", 200), ErrTooDeep, 6 * 128,
			"canon: nesting too deep: more than 256 levels at byte offset 768"},
		{"duplicate", `{"a":1,"a":2}`, ErrDuplicateKey, 7,
			`canon: duplicate object key "a" at byte offset 7`},
		{"duplicate_reports_first_repeat", `{"b":0,"a":1,"b":2,"a":3,"a":4}`, ErrDuplicateKey, 13,
			`canon: duplicate object key "b" at byte offset 13`},
		{"duplicate_escaped", `{"\u00e9":1,"é":2}`, ErrDuplicateKey, 12,
			`canon: duplicate object key "é" at byte offset 12`},
		{"duplicate_long_key_shortened", `{"` + strings.Repeat("k", 100) + `":1,"` + strings.Repeat("k", 100) + `":2}`, ErrDuplicateKey, 106,
			`canon: duplicate object key "` + strings.Repeat("k", 64) + `"... at byte offset 106`},
		{"duplicate_many_members", `{"a0":0,"a1":1,"a2":2,"a3":3,"a4":4,"a5":5,"a6":6,"a7":7,"a8":8,"a9":9,"b0":0,"b1":1,"b2":2,"a5":5}`, ErrDuplicateKey, 92,
			`canon: duplicate object key "a5" at byte offset 92`},
		{"invalid_utf8", "[\"ok\",\"\xe2\x82\"]", ErrInvalidUTF8, 7,
			"canon: invalid UTF-8 in string literal at byte offset 7"},
		{"invalid_utf8_key", "{\"\xff\":1}", ErrInvalidUTF8, 2,
			"canon: invalid UTF-8 in string literal at byte offset 2"},
		{"invalid_utf8_outside_string", "\xc3\xa9", ErrSyntax, 0,
			"canon: invalid JSON: unexpected byte 0xc3 looking for beginning of value at byte offset 0"},
		{"lone_high", `"x\ud800"`, ErrLoneSurrogate, 2,
			`canon: lone surrogate \ud800 in string (a surrogate must be escaped as a high+low pair) at byte offset 2`},
		{"lone_low", `"\uDC01"`, ErrLoneSurrogate, 1,
			`canon: lone surrogate \udc01 in string (a surrogate must be escaped as a high+low pair) at byte offset 1`},
		{"high_then_bad_hex", `"\ud800\u12x4"`, ErrSyntax, 11,
			`canon: invalid JSON: unexpected 'x' in \u escape (expecting a hex digit) at byte offset 11`},
		{"high_at_end", `"\ud800`, ErrLoneSurrogate, 1,
			`canon: lone surrogate \ud800 in string (a surrogate must be escaped as a high+low pair) at byte offset 1`},
		{"number_too_long", "[" + strings.Repeat("1", MaxNumberLen+1) + "]", ErrNumberTooLong, 1,
			"canon: number literal too long: 257 bytes, limit 256 at byte offset 1"},
		{"number_too_long_exponent", "-1e" + strings.Repeat("0", MaxNumberLen), ErrNumberTooLong, 0,
			"canon: number literal too long: 259 bytes, limit 256 at byte offset 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Canonical([]byte(tc.in))
			if err == nil {
				t.Fatalf("accepted: %s", out)
			}
			if out != nil {
				t.Errorf("output %q returned with the error", out)
			}
			if !errors.Is(err, tc.kind) {
				t.Errorf("errors.Is(%v, %v) = false", err, tc.kind)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("%T is not *Error", err)
			}
			if ce.Offset != tc.offset {
				t.Errorf("offset = %d, want %d", ce.Offset, tc.offset)
			}
			if err.Error() != tc.msg {
				t.Errorf("message\n got %s\nwant %s", err, tc.msg)
			}
			// ArgsHash fails the same way.
			c, h, err2 := ArgsHash([]byte(tc.in))
			if err2 == nil || err2.Error() != err.Error() || c != nil || h != "" {
				t.Errorf("ArgsHash = %q, %q, %v", c, h, err2)
			}
		})
	}
}

func TestLimitsAreInclusive(t *testing.T) {
	atDepth := strings.Repeat(`{"a":`, MaxDepth) + "1" + strings.Repeat("}", MaxDepth)
	if _, err := Canonical([]byte(atDepth)); err != nil {
		t.Errorf("objects nested %d deep: %v", MaxDepth, err)
	}
	if _, err := Canonical([]byte("-" + strings.Repeat("1", MaxNumberLen-1))); err != nil {
		t.Errorf("number of %d bytes: %v", MaxNumberLen, err)
	}
	// Depth counts containers only: scalars at the limit are fine.
	atDepth = strings.Repeat("[", MaxDepth) + `"s",1,true` + strings.Repeat("]", MaxDepth)
	if _, err := Canonical([]byte(atDepth)); err != nil {
		t.Errorf("scalars at depth %d: %v", MaxDepth, err)
	}
}

func TestManyMembersSorted(t *testing.T) {
	// More members than the insertion-sort cutoff, in reverse order.
	var in strings.Builder
	in.WriteString("{")
	for i := 99; i >= 0; i-- {
		if i < 99 {
			in.WriteString(",")
		}
		in.WriteString(`"k`)
		in.WriteByte(byte('0' + i/10))
		in.WriteByte(byte('0' + i%10))
		in.WriteString(`":`)
		in.WriteByte(byte('0' + i%10))
	}
	in.WriteString("}")
	got, err := Canonical([]byte(in.String()))
	if err != nil {
		t.Fatal(err)
	}
	want, err := viaEncodingJSON([]byte(in.String()))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestOutputDoesNotAliasInput(t *testing.T) {
	in := []byte(`{"b":[1,"x"],"a":{}}`)
	out, err := Canonical(in)
	if err != nil {
		t.Fatal(err)
	}
	copy(in, strings.Repeat("#", len(in)))
	if string(out) != `{"a":{},"b":[1,"x"]}` {
		t.Errorf("output changed with input: %s", out)
	}
}

func TestConcurrent(t *testing.T) {
	vf := loadVectors(t)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				for _, v := range vf.Canonical {
					got, err := Canonical([]byte(v.Input))
					if err != nil || string(got) != v.Canonical {
						t.Errorf("%s: %s, %v", v.Name, got, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

func TestHashAndStepID(t *testing.T) {
	if h := Hash([]byte("{}")); h != "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a" {
		t.Errorf("Hash({}) = %s", h)
	}
	if h := Hash(nil); h != "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Errorf("Hash(nil) = %s", h)
	}
	// A target longer than StepID's stack buffer.
	long := stepVector{ExecutionID: "e", Kind: "tool_call", Target: strings.Repeat("t", 1000), ArgsHash: Hash(nil), Occurrence: 3}
	if got, want := StepID(long.ExecutionID, long.Kind, long.Target, long.ArgsHash, long.Occurrence), independentStepID(long); got != want {
		t.Errorf("long target: %s, want %s", got, want)
	}
	neg := stepVector{ExecutionID: "e", Kind: "local", Target: "x", Occurrence: -1}
	if got, want := StepID(neg.ExecutionID, neg.Kind, neg.Target, neg.ArgsHash, neg.Occurrence), independentStepID(neg); got != want {
		t.Errorf("negative occurrence: %s, want %s", got, want)
	}
}

func TestAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector randomly drops sync.Pool items")
	}
	in := []byte(benchArgs)
	Canonical(in) // warm the pool
	if n := testing.AllocsPerRun(100, func() { Canonical(in) }); n > 1 {
		t.Errorf("Canonical allocates %v times per call, want 1 (the output)", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		StepID("0190a5f2-7c3e-7b4a-9d2e-1f2a3b4c5d6e", "tool_call", "web_search", "0e7a33c855cdb9ca5e9512f4c4d628546ef12a44e081306b23bfcc4cc3401459", 1)
	}); n > 1 {
		t.Errorf("StepID allocates %v times per call, want 1 (the string)", n)
	}
}
