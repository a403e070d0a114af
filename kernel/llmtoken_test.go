package kernel

import (
	"strings"
	"testing"
)

func TestLLMTokenExecution(t *testing.T) {
	secret := strings.Repeat("A", 43)
	id := "0190c3a1-7c2e-7000-8000-000000000001"
	for _, tc := range []struct {
		tok, want string
	}{
		{"wkg1." + id + "." + secret, id},
		{"wkg1.my.exec.id." + secret, "my.exec.id"}, // ids may hold dots; the secret never does
		{"wkg1." + id + "." + secret[:42], ""},
		{"wkg1." + id + "." + secret + "A", ""},
		{"wkg2." + id + "." + secret, ""},
		{"wkg1.." + secret, ""},
		{"wkg1./etc/passwd." + secret, ""},
		{"sk-" + secret, ""},
		{"", ""},
	} {
		if got := LLMTokenExecution(tc.tok); got != tc.want {
			t.Errorf("LLMTokenExecution(%q) = %q, want %q", tc.tok, got, tc.want)
		}
	}
}
