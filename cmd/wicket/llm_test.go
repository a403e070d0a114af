package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeLLMGateway runs serve with llm_providers in the manifest and
// the gateway on a listener of its own: the gateway answers there (and
// only there), the provider key is read from the environment and never
// logged, and misconfigurations fail the boot.
func TestServeLLMGateway(t *testing.T) {
	const key = "sk-serve-test-provider-key-0123456789"
	t.Setenv("WICKET_TEST_LLM_KEY", key)
	dir := t.TempDir()
	man := filepath.Join(dir, "manifest.yaml")
	if err := os.WriteFile(man, []byte(`llm_providers:
  - name: openai
    dialect: openai
    base_url: http://127.0.0.1:9/v1
    api_key_env: WICKET_TEST_LLM_KEY
    models: [{name: gpt-x, input_usd_per_mtok: 1, output_usd_per_mtok: 2}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	llmAddr := ln.Addr().String()
	ln.Close()
	ready := filepath.Join(dir, "ready")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	var out, errb syncBuffer
	go func() {
		done <- run(ctx, []string{"serve", "--data", filepath.Join(dir, "data"), "--addr", "127.0.0.1:0", "--ready-file", ready,
			"--config", man, "--llm-addr", llmAddr, "--log-level", "debug"}, &out, &errb)
	}()
	var addr []byte
	deadline := time.Now().Add(20 * time.Second)
	for {
		if addr, err = os.ReadFile(ready); err == nil && len(addr) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %s", errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	post := func(url string) (int, string) {
		resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"gpt-x","messages":[]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, body := post("http://" + llmAddr + "/llm/openai/v1/chat/completions"); st != 401 || !strings.Contains(body, `"type":"authentication_error"`) {
		t.Fatalf("gateway listener: %d %s", st, body)
	}
	if st, body := post("http://" + string(addr) + "/llm/openai/v1/chat/completions"); st != 404 || strings.Contains(body, "authentication_error") {
		t.Fatalf("the API listener serves the gateway: %d %s", st, body)
	}
	if resp, err := http.Get("http://" + llmAddr + "/v0/health"); err != nil || resp.StatusCode != 404 {
		t.Fatalf("the gateway listener serves /v0: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if !strings.Contains(errb.String(), "llm gateway") || strings.Contains(errb.String(), key) || strings.Contains(out.String(), key) {
		t.Fatalf("log: %s", errb.String())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not shut down")
	}

	// Misconfigurations fail the boot, naming what is wrong.
	for _, tc := range []struct{ manifest, flag, want string }{
		{"llm_providers: [{name: a, dialect: openai, api_key_env: WICKET_TEST_UNSET_KEY, models: [{name: m}]}]\n", "", "WICKET_TEST_UNSET_KEY is not set"},
		{"llm_providers: [{name: a, dialect: nope, models: [{name: m}]}]\n", "", `dialect "nope" is invalid`},
		{"llm_providers: [{name: a, dialect: openai, base_url: 'http://u:p@127.0.0.1/v1', models: [{name: m}]}]\n", "", "must not hold credentials"},
		{"llm_providers: [{name: a, dialect: openai, models: []}]\n", "", "at least one model"},
		{"tenants: []\n", "--llm-addr=127.0.0.1:0", "--llm-addr needs llm_providers"},
	} {
		p := filepath.Join(t.TempDir(), "m.yaml")
		if err := os.WriteFile(p, []byte(tc.manifest), 0o600); err != nil {
			t.Fatal(err)
		}
		args := []string{"serve", "--data", t.TempDir(), "--addr", "127.0.0.1:0", "--config", p}
		if tc.flag != "" {
			args = append(args, tc.flag)
		}
		if _, _, err := runCmd(t, context.Background(), args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.manifest, err, tc.want)
		}
	}
}
