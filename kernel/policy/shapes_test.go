package policy

import (
	"math"
	"strings"
	"testing"
)

func TestFromBoolean(t *testing.T) {
	for _, c := range []struct {
		entry  string
		v      bool
		action Action // "": nil
	}{
		{"data.authz.allow", true, Allow},
		{"data.authz.allow", false, Deny},
		{"authz/allowed", true, Allow},
		{"data.authz.deny", true, Deny},
		{"authz/deny", false, ""},
		{"data.x.undeny", false, Deny},
	} {
		d := FromBoolean(c.entry, c.v)
		switch {
		case c.action == "" && d != nil:
			t.Errorf("%s %v: got %+v, want nil", c.entry, c.v, d)
		case c.action != "" && (d == nil || d.Action != c.action || d.RuleID != c.entry || d.Validate() != nil):
			t.Errorf("%s %v: got %+v, want %s", c.entry, c.v, d, c.action)
		}
	}
}

func TestFromMessages(t *testing.T) {
	if d := FromMessages("data.p.deny", nil); d != nil {
		t.Fatalf("no messages: %+v", d)
	}
	d := FromMessages("data.p.deny", []string{"b", "a", "b"})
	if d.Action != Deny || d.Reason != "a; b" || d.RuleID != "data.p.deny" {
		t.Fatalf("got %+v", d)
	}
	long := FromMessages("data.p.deny", []string{strings.Repeat("é", 600)})
	if len(long.Reason) > maxShapeReason+len("…") || !strings.HasSuffix(long.Reason, "…") || !strings.HasPrefix(long.Reason, "é") {
		t.Fatalf("long reason: %d bytes", len(long.Reason))
	}
	for _, r := range long.Reason {
		if r == '\uFFFD' {
			t.Fatal("reason cut inside a rune")
		}
	}
}

func TestAcceptsShapes(t *testing.T) {
	for entry, want := range map[string]bool{"data.wicket.decision": false, "p/decision": false, "data.p.allow": true, "deny": true} {
		if got := AcceptsShapes(entry); got != want {
			t.Errorf("%s: %v", entry, got)
		}
	}
}

func TestIntegerNumber(t *testing.T) {
	for lit, want := range map[string]int{"10": 10, "10.0": 10, "1e1": 10, "1E+1": 10, "100e-1": 10, "-3": -3, "0": 0, "-0": 0, "9223372036854775807": math.MaxInt64} {
		if got, ok := IntegerNumber(lit); !ok || got != want {
			t.Errorf("IntegerNumber(%q) = %d, %v; want %d", lit, got, ok, want)
		}
	}
	for _, lit := range []string{"10.5", "1e-1", "1e30", "9223372036854775808", "\"10\"", "0x10", "1/2", "", "10.", ".5", "+1", "NaN", "1e999999999", strings.Repeat("1", 65)} {
		if got, ok := IntegerNumber(lit); ok {
			t.Errorf("IntegerNumber(%q) = %d, true; want false", lit, got)
		}
	}
}
