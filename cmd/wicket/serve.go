package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/wicket-run/wicket/internal/manifest"
	"github.com/wicket-run/wicket/internal/netguard"
	"github.com/wicket-run/wicket/internal/webhook"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/plugins/wasm"
	"github.com/wicket-run/wicket/server"
	"github.com/wicket-run/wicket/server/wire"
)

// serveOptions are the flags of `wicket serve`; each has a WICKET_* twin.
type serveOptions struct {
	data, addr, config, adminKey  string
	store, replica                string
	leaseTimeout, dispatchTimeout time.Duration
	approvalTimeout               time.Duration
	dispatchMaxAttempts           int
	approvalExpiry, defaultPolicy string
	logLevel, logFormat           string
	maxBody                       int64
	noSync                        bool
	readyFile                     string
	webhookAllow, webhookDeny     stringList
	signatureTolerance            time.Duration
}

// stringList is a repeatable flag whose environment twin is a
// comma-separated list; flags given on the command line replace the
// environment's values.
type stringList struct {
	vals    []string
	fromEnv bool
}

func (l *stringList) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(l.vals, ",")
}

// Set appends one value (or several, comma-separated).
func (l *stringList) Set(v string) error {
	if l.fromEnv {
		l.vals, l.fromEnv = nil, false
	}
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			l.vals = append(l.vals, s)
		}
	}
	return nil
}

func envList(name string) stringList {
	var l stringList
	_ = l.Set(os.Getenv(name))
	l.fromEnv = true
	return l
}

func envString(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv(name); ok {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

func envInt(name string, def int) int {
	if v, ok := os.LookupEnv(name); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

func serveFlags(o *serveOptions, fs *flag.FlagSet) {
	d := kernel.DefaultConfig()
	fs.StringVar(&o.data, "data", envString("WICKET_DATA", "./wicket-data"), "data directory (WICKET_DATA)")
	fs.StringVar(&o.store, "store", envString("WICKET_STORE", ""), "postgres://… URL of a shared PostgreSQL store; empty: the embedded store under --data (WICKET_STORE)")
	fs.StringVar(&o.replica, "replica", envString("WICKET_REPLICA", ""), "this kernel's name among the replicas of a shared store, recorded in dispatch.claimed events (default on PostgreSQL: host-pid) (WICKET_REPLICA)")
	fs.StringVar(&o.addr, "addr", envString("WICKET_ADDR", "127.0.0.1:8080"), "listen address (WICKET_ADDR)")
	fs.StringVar(&o.config, "config", envString("WICKET_CONFIG", ""), "provisioning manifest (WICKET_CONFIG)")
	fs.StringVar(&o.adminKey, "admin-key", envString("WICKET_ADMIN_KEY", ""), "admin API key (WICKET_ADMIN_KEY)")
	fs.DurationVar(&o.leaseTimeout, "lease-timeout", envDuration("WICKET_LEASE_TIMEOUT", d.LeaseTimeout), "dispatch lease without heartbeat (WICKET_LEASE_TIMEOUT)")
	fs.DurationVar(&o.dispatchTimeout, "dispatch-timeout", envDuration("WICKET_DISPATCH_TIMEOUT", d.DispatchTimeout), "timeout of one webhook POST (WICKET_DISPATCH_TIMEOUT)")
	fs.IntVar(&o.dispatchMaxAttempts, "dispatch-max-attempts", envInt("WICKET_DISPATCH_MAX_ATTEMPTS", d.DispatchMaxAttempts), "delivery attempts before dispatch_exhausted (WICKET_DISPATCH_MAX_ATTEMPTS)")
	fs.DurationVar(&o.approvalTimeout, "approval-timeout", envDuration("WICKET_APPROVAL_TIMEOUT", d.ApprovalTimeout), "default approval lifetime (WICKET_APPROVAL_TIMEOUT)")
	fs.StringVar(&o.approvalExpiry, "approval-expiry", envString("WICKET_APPROVAL_EXPIRY", d.ApprovalExpiry), "on expiry: fail_execution or deny_step (WICKET_APPROVAL_EXPIRY)")
	fs.StringVar(&o.defaultPolicy, "default-policy", envString("WICKET_DEFAULT_POLICY", "allow"), "policy of agents bound to no bundle: allow, deny or a bundle name (WICKET_DEFAULT_POLICY)")
	fs.StringVar(&o.logLevel, "log-level", envString("WICKET_LOG_LEVEL", "info"), "debug, info, warn or error (WICKET_LOG_LEVEL)")
	fs.StringVar(&o.logFormat, "log-format", envString("WICKET_LOG_FORMAT", "text"), "text or json (WICKET_LOG_FORMAT)")
	fs.Int64Var(&o.maxBody, "max-body", int64(envInt("WICKET_MAX_BODY", 1<<20)), "largest request body in bytes (WICKET_MAX_BODY)")
	fs.BoolVar(&o.noSync, "unsafe-no-fsync", os.Getenv("WICKET_UNSAFE_NO_FSYNC") == "1", "skip fsync on commit (benchmarks only: loses acknowledged writes on power loss)")
	fs.DurationVar(&o.signatureTolerance, "signature-tolerance", envDuration("WICKET_SIGNATURE_TOLERANCE", wire.DefaultSignatureTolerance),
		"how far an agent's v1 signature timestamp may be from this clock (WICKET_SIGNATURE_TOLERANCE)")
	o.webhookAllow, o.webhookDeny = envList("WICKET_WEBHOOK_ALLOW_CIDR"), envList("WICKET_WEBHOOK_DENY_CIDR")
	fs.Var(&o.webhookAllow, "webhook-allow-cidr", "admit webhook addresses in this prefix (repeatable; WICKET_WEBHOOK_ALLOW_CIDR, comma-separated)")
	fs.Var(&o.webhookDeny, "webhook-deny-cidr", "refuse webhook addresses in this prefix (repeatable; WICKET_WEBHOOK_DENY_CIDR, comma-separated)")
	fs.StringVar(&o.readyFile, "ready-file", envString("WICKET_READY_FILE", ""), "write the bound address to this file once serving (tests, supervisors)")
}

func newLogger(level, format string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usageError{fmt.Sprintf("--log-level %q: want debug, info, warn or error", level)}
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageError{fmt.Sprintf("--log-format %q: want text or json", format)}
}

// isLoopback reports whether a listen address only serves this machine.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func serveCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o serveOptions
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	serveFlags(&o, fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("serve: unexpected argument %q", fs.Arg(0))}
	}
	log, err := newLogger(o.logLevel, o.logFormat, stderr)
	if err != nil {
		return err
	}
	var man *manifest.Manifest
	if o.config != "" {
		if man, err = manifest.Load(o.config, nil); err != nil {
			return err
		}
	}
	keysConfigured := o.adminKey != ""
	if man != nil {
		for _, t := range man.Tenants {
			keysConfigured = keysConfigured || len(t.Keys) > 0
		}
	}
	if !keysConfigured && !isLoopback(o.addr) {
		return usageError{fmt.Sprintf("serve: refusing to listen on %s without an API key: set --admin-key (WICKET_ADMIN_KEY) or bind a loopback address", o.addr)}
	}
	if o.signatureTolerance <= 0 {
		return usageError{"serve: --signature-tolerance must be positive"}
	}
	if o.adminKey != "" && len(o.adminKey) < 16 {
		return usageError{"serve: --admin-key must be at least 16 bytes"}
	}

	guard, err := webhookGuard(o)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.data, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	st, err := openStore(ctx, o.store, o.data, o.noSync)
	if err != nil {
		return err
	}
	defer st.Close()

	// The kernel's own address is a forbidden webhook destination from the
	// start (the manifest registers agents before the listener opens);
	// SetSelf is called again with the bound address below.
	if self, err := net.ResolveTCPAddr("tcp", o.addr); err == nil && self.Port != 0 {
		guard.SetSelf(self)
	}

	if o.replica == "" && st.kind == "postgres" {
		host, _ := os.Hostname()
		o.replica = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	cfg := kernel.Config{Replica: o.replica, LeaseTimeout: o.leaseTimeout, DispatchTimeout: o.dispatchTimeout, DispatchMaxAttempts: o.dispatchMaxAttempts,
		ApprovalTimeout: o.approvalTimeout, ApprovalExpiry: o.approvalExpiry, Logger: log}
	if o.dispatchTimeout >= o.leaseTimeout {
		cfg.DispatchTimeout = o.leaseTimeout / 2
	}
	sender := webhook.New(webhook.WithGuard(guard))
	defer sender.Close()
	k, err := kernel.New(st.Store, sender, nil, cfg) // the store itself: kernel.Feed is found on it
	if err != nil {
		return usageError{err.Error()}
	}
	wasmEngine := wasm.New(wasm.Config{CacheDir: filepath.Join(o.data, "wasm-cache")})
	defer wasmEngine.Close()
	host := plugins.NewHost(plugins.Options{DefaultPolicy: o.defaultPolicy, Guards: k.TenantGuards}, rules.New(), rego.New(), wasmEngine)
	defer host.Close()
	k.SetPolicy(host)
	k.SetBundleLoader(host)
	if err := k.LoadBundles(ctx); err != nil {
		return err
	}
	if man != nil {
		if err := man.Apply(ctx, k); err != nil {
			return fmt.Errorf("apply manifest %s: %w", o.config, err)
		}
		log.Info("manifest applied", "path", o.config, "agents", len(man.Agents), "tenants", len(man.Tenants), "bundles", len(man.Bundles))
	}

	srv := server.New(k, server.Config{AdminKey: o.adminKey, AuthDisabled: !keysConfigured, MaxBodyBytes: o.maxBody,
		SignatureTolerance: o.signatureTolerance, Logger: log})
	if !keysConfigured {
		log.Warn("no API key configured: client and admin authentication is DISABLED; serving loopback only", "addr", o.addr)
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.addr, err)
	}
	guard.SetSelf(ln.Addr())
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	hs.RegisterOnShutdown(srv.CloseStreams) // SSE clients reconnect with Last-Event-ID
	if err := k.Start(ctx); err != nil {
		return err
	}
	srv.SetReady(true)
	log.Info("wicket serving", "addr", ln.Addr().String(), "store", st.kind, "at", st.desc, "replica", o.replica, "data", o.data, "version", version, "fsync", !o.noSync)
	if o.readyFile != "" {
		if err := os.WriteFile(o.readyFile, []byte(ln.Addr().String()), 0o600); err != nil {
			return fmt.Errorf("write ready file: %w", err)
		}
	}
	fmt.Fprintf(stdout, "wicket listening on http://%s\n", ln.Addr())

	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	srv.SetReady(false)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("http shutdown", "err", err)
	}
	if err := k.Close(sctx); err != nil {
		log.Warn("kernel shutdown", "err", err)
	}
	log.Info("stopped")
	return nil
}

// webhookGuard builds the webhook address policy from the
// --webhook-allow-cidr and --webhook-deny-cidr flags.
func webhookGuard(o serveOptions) (*netguard.Guard, error) {
	allow, err := netguard.ParsePrefixes(o.webhookAllow.vals)
	if err != nil {
		return nil, usageError{"--webhook-allow-cidr: " + err.Error()}
	}
	deny, err := netguard.ParsePrefixes(o.webhookDeny.vals)
	if err != nil {
		return nil, usageError{"--webhook-deny-cidr: " + err.Error()}
	}
	return netguard.New(netguard.Options{Allow: allow, Deny: deny, What: "--webhook-deny-cidr"}), nil
}

// discardLogger drops every record (bench output stays readable).
func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
