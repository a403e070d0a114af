package policy

import (
	"math"
	"math/big"
	"regexp"
	"slices"
	"strings"
)

// Policies written for OPA often answer with a boolean (allow := true) or
// a set of messages (deny contains msg if ...) instead of a decision
// object. The Rego and OPA-ABI wasm engines map those answers with the
// functions below, so both give the same decision for the same answer.

// maxShapeReason bounds the reason built from deny messages.
const maxShapeReason = 1024

// lastName returns an entrypoint's last name: rule of data.pkg.rule or pkg/rule.
func lastName(entrypoint string) string {
	return entrypoint[strings.LastIndexAny(entrypoint, "./")+1:]
}

// AcceptsShapes reports whether an entrypoint's answer may be a boolean or
// a set of deny messages: every entrypoint but one named decision
// (data.wicket.decision), which answers a decision object, so that a slip
// such as decision := true is an error and not an allow.
func AcceptsShapes(entrypoint string) bool { return lastName(entrypoint) != "decision" }

// IsDenyEntrypoint reports whether the entrypoint's last name is deny
// (data.authz.deny, authz/deny), where a boolean true means deny.
func IsDenyEntrypoint(entrypoint string) bool { return lastName(entrypoint) == "deny" }

// FromBoolean maps a boolean answer of entrypoint (written data.pkg.rule).
// For an entrypoint named deny, true denies and false is no match (nil).
// For any other (allow, authz/allowed, ...), true allows and false denies:
// OPA's "default allow := false" is a denial.
func FromBoolean(entrypoint string, v bool) *Answer {
	switch {
	case IsDenyEntrypoint(entrypoint) && v:
		return &Answer{Action: Deny, Reason: entrypoint + " is true", RuleID: entrypoint}
	case IsDenyEntrypoint(entrypoint):
		return nil
	case v:
		return &Answer{Action: Allow, Reason: entrypoint + " is true", RuleID: entrypoint}
	default:
		return &Answer{Action: Deny, Reason: entrypoint + " is false", RuleID: entrypoint}
	}
}

// FromMessages maps a set (or array) of deny messages, the answer of a
// "deny contains msg if ..." entrypoint: none is no match (nil); any denies
// the step, the sorted distinct messages joined by "; " as the reason
// (at most 1 KiB).
func FromMessages(entrypoint string, msgs []string) *Answer {
	if len(msgs) == 0 {
		return nil
	}
	msgs = slices.Clone(msgs)
	slices.Sort(msgs)
	msgs = slices.Compact(msgs)
	reason := strings.Join(msgs, "; ")
	if len(reason) > maxShapeReason {
		cut := maxShapeReason
		for cut > 0 && !utf8Start(reason[cut]) {
			cut--
		}
		reason = reason[:cut] + "…"
	}
	return &Answer{Action: Deny, Reason: reason, RuleID: entrypoint}
}

// utf8Start reports whether b starts a UTF-8 sequence.
func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// jsonNumber is the grammar of a JSON number literal.
var jsonNumber = regexp.MustCompile(`^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?$`)

// IntegerNumber returns the value of a JSON number literal that is an
// integer however it is written (10, 10.0, 1e1: Rego arithmetic and OPA's
// wasm write numbers so), and false for a fraction, a value beyond int, or
// anything that is not a number literal of at most 64 bytes. Both engines
// read an answer's rate_limit.max_calls with it.
func IntegerNumber(lit string) (int, bool) {
	if len(lit) > 64 || !jsonNumber.MatchString(lit) {
		return 0, false
	}
	f, _, err := big.ParseFloat(lit, 10, 256, big.ToNearestEven)
	if err != nil || !f.IsInt() {
		return 0, false
	}
	i, acc := f.Int64()
	if acc != big.Exact || i > math.MaxInt || i < math.MinInt {
		return 0, false
	}
	return int(i), true
}
