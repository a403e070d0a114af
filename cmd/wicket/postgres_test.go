package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/bbolt"
	"github.com/wicket-run/wicket/store/postgres"
	"github.com/wicket-run/wicket/store/postgres/pgtest"
)

// TestServeOnPostgres runs serve with WICKET_STORE naming a PostgreSQL
// database: an agent registered over HTTP is in that database.
func TestServeOnPostgres(t *testing.T) {
	_, dsn := pgtest.Schema(t)
	t.Setenv("WICKET_STORE", dsn)
	srv := startServe(t)
	body := strings.NewReader(`{"id":"pg-agent","webhook_url":"http://127.0.0.1:1/hook","secret":"0123456789abcdef"}`)
	resp, err := http.Post(srv.url+"/v0/agents", "application/json", body)
	if err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("register agent: %v %v", resp, err)
	}
	resp.Body.Close()
	if !strings.Contains(srv.stderr.String(), "store=postgres") {
		t.Errorf("the log does not say which store serves: %s", srv.stderr.String())
	}
	if _, err := os.Stat(filepath.Join(srv.data, "wicket.db")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("serve on PostgreSQL created a bbolt file (%v)", err)
	}
	if err := srv.stop(); err != nil {
		t.Fatalf("serve returned %v", err)
	}
	st, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.View(context.Background(), func(tx kernel.ReadTx) error {
		_, err := tx.Agent(kernel.DefaultTenant, "pg-agent")
		return err
	}); err != nil {
		t.Errorf("the agent is not in the database: %v", err)
	}
}

func TestServeRefusesUnknownStore(t *testing.T) {
	_, _, err := runCmd(t, context.Background(), "serve", "--data", t.TempDir(), "--addr", "127.0.0.1:0", "--store", "mysql://root:hunter2@db/wicket")
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "postgres://") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("serve --store mysql://…: %v", err)
	}
}

// TestBenchReplicas runs the bench with two kernels on one PostgreSQL
// database, the load taking them in turn; its schema is gone afterwards.
func TestBenchReplicas(t *testing.T) {
	base := pgtest.BaseDSN(t)
	out, _, err := runCmd(t, context.Background(), "bench", "--executions", "3", "--steps", "60", "--store", base, "--replicas", "2", "--load-in-process")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"store postgres, 2 replica(s)", "steps:           60 over HTTP", "p99", "conflicts:", "server CPU:"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench output lacks %q:\n%s", want, out)
		}
	}
	c, err := pgx.Connect(context.Background(), base)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var left bool
	if err := c.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`,
		fmt.Sprintf("wicket_bench_%d", os.Getpid())).Scan(&left); err != nil || left {
		t.Errorf("the bench's schema is still there (%v)", err)
	}
	if _, _, err := runCmd(t, context.Background(), "bench", "--replicas", "2"); err == nil {
		t.Error("bench --replicas 2 on bbolt accepted")
	}
}

// TestStoreCopy moves a kernel's data directory into PostgreSQL and back,
// each hop verified by the command itself.
func TestStoreCopy(t *testing.T) {
	_, dsn := pgtest.Schema(t)
	ctx := context.Background()
	dir := t.TempDir()
	st, err := bbolt.Open(filepath.Join(dir, "wicket.db"), bbolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	k, err := kernel.New(st, nil, nil, nil, kernel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.CreateTenant(ctx, kernel.Tenant{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := k.CreateKey(ctx, "acme", kernel.RoleClient, "ci", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := k.PutAgent(ctx, kernel.Agent{ID: "a", Tenant: "acme", WebhookURL: "http://127.0.0.1:1/", Secret: "0123456789abcdef"}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, _, err := k.CreateExecution(ctx, kernel.CreateExecution{Tenant: "acme", AgentID: "a", Input: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	out, _, err := runCmd(t, ctx, "store", "copy", "--from", dir, "--to", dsn)
	if err != nil {
		t.Fatalf("copy into PostgreSQL: %v", err)
	}
	for _, want := range []string{"(bbolt) to ", "(postgres)", "execution 3", "event 6", "api_key 1", "verified: both stores pass their checks"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	back := filepath.Join(t.TempDir(), "back")
	out2, _, err := runCmd(t, ctx, "store", "copy", "--from", dsn, "--to", back)
	if err != nil {
		t.Fatalf("copy back: %v", err)
	}
	sum := func(s string) string { return s[strings.LastIndex(s, "records "):] }
	if sum(out) != sum(out2) {
		t.Errorf("the round trip changed the records:\n%s\n%s", out, out2)
	}
	if _, _, err := runCmd(t, ctx, "store", "copy", "--from", dir, "--to", dsn); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("copy into a full database: %v", err)
	}
	// The verified copy says where it came from, and is not marked
	// incomplete (a kernel would refuse it).
	bst, err := bbolt.Open(filepath.Join(back, "wicket.db"), bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var mark []byte
	if err := bst.View(ctx, func(tx kernel.ReadTx) error {
		mark, err = tx.Counter(kernel.DefaultTenant, kernel.CopyMarkKey)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_ = bst.Close()
	if !strings.HasPrefix(string(mark), "copied from a postgres store at ") {
		t.Errorf("the copy's mark is %q, want what it was copied from", mark)
	}
	if _, _, err := runCmd(t, ctx, "store", "copy", "--from", filepath.Join(dir, "missing"), "--to", t.TempDir()); err == nil {
		t.Error("copy from a missing directory succeeded")
	}
}
