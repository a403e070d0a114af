package wire

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
)

func TestSign(t *testing.T) {
	tests := []struct {
		name         string
		secret, body string
		want         string
	}{
		// RFC 4231 test case 2.
		{"rfc4231 case 2", "Jefe", "what do ya want for nothing?",
			"sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
		{"empty body", "0123456789abcdef", "",
			"sha256=" + hexHMAC("0123456789abcdef", "")},
		{"webhook body", "s3cr3t-s3cr3t-s3cr3t", `{"execution_id":"e","dispatch_id":"d","dispatch_attempt":1}`,
			"sha256=" + hexHMAC("s3cr3t-s3cr3t-s3cr3t", `{"execution_id":"e","dispatch_id":"d","dispatch_attempt":1}`)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Sign([]byte(tc.secret), []byte(tc.body))
			if got != tc.want {
				t.Fatalf("Sign = %s, want %s", got, tc.want)
			}
			if got != strings.ToLower(got) {
				t.Fatalf("Sign is not lowercase: %s", got)
			}
			if !Verify([]byte(tc.secret), []byte(tc.body), got) {
				t.Fatal("Verify rejects Sign's output")
			}
		})
	}
}

func hexHMAC(secret, body string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(body))
	return hex.EncodeToString(m.Sum(nil))
}

func TestVerifyRejects(t *testing.T) {
	secret := []byte("0123456789abcdef")
	body := []byte(`{"a":1}`)
	good := Sign(secret, body)
	hexPart := strings.TrimPrefix(good, SignaturePrefix)
	flipped := []byte(hexPart)
	if flipped[0] == '0' {
		flipped[0] = '1'
	} else {
		flipped[0] = '0'
	}
	tests := []struct {
		name   string
		secret []byte
		body   []byte
		header string
		want   bool
	}{
		{"good", secret, body, good, true},
		{"uppercase hex accepted", secret, body, SignaturePrefix + strings.ToUpper(hexPart), true},
		{"empty header", secret, body, "", false},
		{"no prefix", secret, body, hexPart, false},
		{"wrong prefix", secret, body, "sha1=" + hexPart, false},
		{"prefix case", secret, body, "SHA256=" + hexPart, false},
		{"short", secret, body, good[:len(good)-2], false},
		{"long", secret, body, good + "00", false},
		{"not hex", secret, body, SignaturePrefix + strings.Repeat("zz", 32), false},
		{"space", secret, body, " " + good, false},
		{"other body", secret, []byte(`{"a":2}`), good, false},
		{"other secret", []byte("fedcba9876543210"), body, good, false},
		{"flipped digit", secret, body, SignaturePrefix + string(flipped), false},
		{"empty secret", nil, body, Sign(nil, body), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Verify(tc.secret, tc.body, tc.header); got != tc.want {
				t.Fatalf("Verify = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestShapes(t *testing.T) {
	// The field names are the protocol: pin them.
	tests := []struct {
		name string
		v    any
		want string
	}{
		{"webhook", WebhookPayload{ExecutionID: "e", DispatchID: "d", DispatchAttempt: 2},
			`{"execution_id":"e","dispatch_id":"d","dispatch_attempt":2}`},
		{"step submit", StepSubmitRequest{Kind: "tool_call", Target: "t", Args: json.RawMessage(`{"q":1}`), Idempotency: "at_most_once", Effect: "read_only"},
			`{"kind":"tool_call","target":"t","args":{"q":1},"idempotency":"at_most_once","effect":"read_only"}`},
		{"decision", StepDecision{Decision: DecisionProceed, StepID: "s"},
			`{"decision":"proceed","step_id":"s","occurrence":0}`},
		{"error", ErrorBody{Code: CodeNotFound, Message: "x"}, `{"code":"not_found","message":"x"}`},
		{"delta", StreamDelta{Seq: 3, Data: json.RawMessage(`"hi"`)}, `{"seq":3,"data":"hi"}`},
		{"heartbeat parked", HeartbeatResponse{}, `{"lease_until":null}`},
		{"list", ExecutionList{Executions: []Execution{}}, `{"executions":[],"next_cursor":""}`},
		{"complete", StepCompleteRequest{Result: json.RawMessage(`1`), Usage: &Usage{TotalTokens: 5}}, `{"result":1,"usage":{"total_tokens":5}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.v)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Fatalf("got  %s\nwant %s", b, tc.want)
			}
		})
	}
}

func FuzzVerify(f *testing.F) {
	f.Add([]byte("0123456789abcdef"), []byte(`{"a":1}`), "")
	f.Add([]byte("k"), []byte(""), Sign([]byte("k"), nil))
	f.Add([]byte("k"), []byte("body"), "sha256=zz")
	f.Fuzz(func(t *testing.T, secret, body []byte, header string) {
		good := Sign(secret, body)
		if len(secret) > 0 && !Verify(secret, body, good) {
			t.Fatalf("Verify rejects its own signature")
		}
		if Verify(secret, body, header) {
			// Anything accepted must be the signature, up to hex case.
			if !strings.EqualFold(header, good) || !strings.HasPrefix(header, SignaturePrefix) {
				t.Fatalf("Verify accepted %q; the signature is %q", header, good)
			}
		}
	})
}
