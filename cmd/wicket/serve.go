package main

import (
	"cmp"
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
	"syscall"
	"time"

	"github.com/wicket-run/wicket/internal/manifest"
	"github.com/wicket-run/wicket/internal/metrics"
	"github.com/wicket-run/wicket/internal/netguard"
	"github.com/wicket-run/wicket/internal/webhook"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/pull"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/plugins/wasm"
	"github.com/wicket-run/wicket/server"
	"github.com/wicket-run/wicket/server/console"
	"github.com/wicket-run/wicket/server/llmgw"
	"github.com/wicket-run/wicket/server/wire"
	"github.com/wicket-run/wicket/store/bbolt"
	"github.com/wicket-run/wicket/store/postgres"
)

// serveOptions are the flags of `wicket serve`; each has a WICKET_* twin.
type serveOptions struct {
	data, addr, config, adminKey  string
	store, replica                string
	adminKeyFile                  string
	leaseTimeout, dispatchTimeout time.Duration
	approvalTimeout               time.Duration
	dispatchMaxAttempts           int
	approvalExpiry, defaultPolicy string
	logLevel, logFormat           string
	maxBody                       int64
	noSync, noWAL                 bool
	commitEvery                   time.Duration
	readyFile                     string
	limits                        limitOptions
	metricsAddr, metricsKey       string
	retention, retentionInterval  time.Duration
	bundleKeyFile, bundleKeyID    string
	bundleKeyAlg                  string
	net                           netLimits
	webhookAllow, webhookDeny     stringList
	signatureTolerance            time.Duration
	pprofAddr                     string
	ui                            uiOptions
	llm                           llmOptions
}

// uiOptions configure the console served at /ui/ (server/console).
type uiOptions struct {
	disabled     bool
	secureCookie bool
}

// llmOptions are the LLM gateway's flags; its providers come from the
// manifest (llm_providers).
type llmOptions struct {
	addr            string
	maxBody         int64
	upstreamTimeout time.Duration
}

// netLimits are what an unauthenticated caller may cost: the request
// limits of `serve` (server.Config).
type netLimits struct {
	maxBundleBody                           int64
	readHeaderTimeout, readTimeout, idleTmo time.Duration
	maxConns, maxStreamsPerTenant           int
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
	fs.StringVar(&o.adminKey, "admin-key", envString("WICKET_ADMIN_KEY", ""), "admin API key (WICKET_ADMIN_KEY); prefer --admin-key-file, which keeps it out of ps")
	fs.StringVar(&o.adminKeyFile, "admin-key-file", envString("WICKET_ADMIN_KEY_FILE", ""), "read the admin API key from this file (WICKET_ADMIN_KEY_FILE)")
	fs.DurationVar(&o.leaseTimeout, "lease-timeout", envDuration("WICKET_LEASE_TIMEOUT", d.LeaseTimeout), "dispatch lease without heartbeat (WICKET_LEASE_TIMEOUT)")
	fs.DurationVar(&o.dispatchTimeout, "dispatch-timeout", envDuration("WICKET_DISPATCH_TIMEOUT", d.DispatchTimeout), "timeout of one webhook POST (WICKET_DISPATCH_TIMEOUT)")
	fs.IntVar(&o.dispatchMaxAttempts, "dispatch-max-attempts", envInt("WICKET_DISPATCH_MAX_ATTEMPTS", d.DispatchMaxAttempts), "delivery attempts before dispatch_exhausted (WICKET_DISPATCH_MAX_ATTEMPTS)")
	fs.DurationVar(&o.approvalTimeout, "approval-timeout", envDuration("WICKET_APPROVAL_TIMEOUT", d.ApprovalTimeout), "default approval lifetime (WICKET_APPROVAL_TIMEOUT)")
	fs.StringVar(&o.approvalExpiry, "approval-expiry", envString("WICKET_APPROVAL_EXPIRY", string(d.ApprovalExpiry)), "on expiry: fail_execution or deny_step (WICKET_APPROVAL_EXPIRY)")
	fs.StringVar(&o.defaultPolicy, "default-policy", envString("WICKET_DEFAULT_POLICY", "allow"), "policy of agents bound to no bundle: allow, deny or a bundle name (WICKET_DEFAULT_POLICY)")
	fs.StringVar(&o.logLevel, "log-level", envString("WICKET_LOG_LEVEL", "info"), "debug, info, warn or error (WICKET_LOG_LEVEL)")
	fs.StringVar(&o.logFormat, "log-format", envString("WICKET_LOG_FORMAT", "text"), "text or json (WICKET_LOG_FORMAT)")
	fs.Int64Var(&o.maxBody, "max-body", int64(envInt("WICKET_MAX_BODY", 1<<20)), "largest request body in bytes, bundles aside (WICKET_MAX_BODY)")
	fs.Int64Var(&o.net.maxBundleBody, "max-bundle-body", int64(envInt("WICKET_MAX_BUNDLE_BODY", int(server.DefaultMaxBundleBytes))), "largest bundle upload in bytes, admin and tenant-admin keys only (WICKET_MAX_BUNDLE_BODY)")
	fs.DurationVar(&o.net.readHeaderTimeout, "read-header-timeout", envDuration("WICKET_READ_HEADER_TIMEOUT", server.DefaultReadHeaderTimeout), "time to read a request's headers (WICKET_READ_HEADER_TIMEOUT)")
	fs.DurationVar(&o.net.readTimeout, "read-timeout", envDuration("WICKET_READ_TIMEOUT", server.DefaultReadTimeout), "time to read a whole request, body included (WICKET_READ_TIMEOUT)")
	fs.DurationVar(&o.net.idleTmo, "idle-timeout", envDuration("WICKET_IDLE_TIMEOUT", server.DefaultIdleTimeout), "how long a keep-alive connection may idle (WICKET_IDLE_TIMEOUT)")
	fs.IntVar(&o.net.maxConns, "max-conns", envInt("WICKET_MAX_CONNS", server.DefaultMaxConns), "open connections at most, lowered to fit the file descriptor limit; idle ones are closed for room (WICKET_MAX_CONNS)")
	fs.IntVar(&o.net.maxStreamsPerTenant, "max-streams-per-tenant", envInt("WICKET_MAX_STREAMS_PER_TENANT", server.DefaultMaxStreamsPerTenant), "open event streams per tenant at most (WICKET_MAX_STREAMS_PER_TENANT)")
	fs.BoolVar(&o.noWAL, "no-wal", envBool("WICKET_NO_WAL", false), "embedded store: commit with bbolt's own two fsyncs over every page written instead of one append to its write-ahead log (as durable, slower) (WICKET_NO_WAL)")
	fs.DurationVar(&o.commitEvery, "commit-interval", envDuration("WICKET_COMMIT_INTERVAL", 0), "embedded store with its write-ahead log: how long one bbolt transaction stays open across batches before it is committed to the file (each batch is durable once its log record is synced; 0: 20ms; negative: every batch, reads then never wait for the writer) (WICKET_COMMIT_INTERVAL)")
	fs.BoolVar(&o.noSync, "unsafe-no-fsync", envBool("WICKET_UNSAFE_NO_FSYNC", false), "skip fsync on commit (benchmarks only: the embedded store, without its log, keeps up to --commit-interval of acknowledged writes in memory, lost if the kernel dies; a power loss loses more) (WICKET_UNSAFE_NO_FSYNC)")
	fs.DurationVar(&o.retention, "retention", envDuration("WICKET_RETENTION", 0), "delete terminal executions (with their events, steps, approvals, counters) this long after they end; 0 keeps them (WICKET_RETENTION; a tenant's retention overrides it)")
	fs.DurationVar(&o.retentionInterval, "retention-interval", envDuration("WICKET_RETENTION_INTERVAL", d.RetentionInterval), "time between retention passes (WICKET_RETENTION_INTERVAL)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", envString("WICKET_METRICS_ADDR", ""), "serve /metrics on this address instead of the API's (WICKET_METRICS_ADDR)")
	fs.StringVar(&o.metricsKey, "metrics-key", envString("WICKET_METRICS_KEY", ""), "bearer key /metrics requires; the admin key works too (WICKET_METRICS_KEY; empty: /metrics is open)")
	fs.StringVar(&o.bundleKeyFile, "bundle-verification-key", envString("WICKET_BUNDLE_VERIFICATION_KEY", ""), "PEM public key (or HMAC secret) file that verifies bundle signatures; every bundle must then be signed (WICKET_BUNDLE_VERIFICATION_KEY)")
	fs.StringVar(&o.bundleKeyID, "bundle-verification-key-id", envString("WICKET_BUNDLE_VERIFICATION_KEY_ID", bundle.DefaultKeyID), "key id signatures name (kid) (WICKET_BUNDLE_VERIFICATION_KEY_ID)")
	fs.StringVar(&o.bundleKeyAlg, "bundle-verification-alg", envString("WICKET_BUNDLE_VERIFICATION_ALG", bundle.DefaultAlgorithm), "signature algorithm: RS256, ES256, HS256, ... (WICKET_BUNDLE_VERIFICATION_ALG)")
	fs.DurationVar(&o.signatureTolerance, "signature-tolerance", envDuration("WICKET_SIGNATURE_TOLERANCE", wire.DefaultSignatureTolerance),
		"how far an agent's v1 signature timestamp may be from this clock (WICKET_SIGNATURE_TOLERANCE)")
	o.webhookAllow, o.webhookDeny = envList("WICKET_WEBHOOK_ALLOW_CIDR"), envList("WICKET_WEBHOOK_DENY_CIDR")
	fs.Var(&o.webhookAllow, "webhook-allow-cidr", "admit webhook addresses in this prefix (repeatable; WICKET_WEBHOOK_ALLOW_CIDR, comma-separated)")
	fs.Var(&o.webhookDeny, "webhook-deny-cidr", "refuse webhook addresses in this prefix (repeatable; WICKET_WEBHOOK_DENY_CIDR, comma-separated)")
	fs.StringVar(&o.pprofAddr, "pprof", envString("WICKET_PPROF", ""), "serve Go's profiler (net/http/pprof) on this loopback address, e.g. 127.0.0.1:6060 (WICKET_PPROF)")
	fs.BoolVar(&o.ui.disabled, "no-ui", os.Getenv("WICKET_NO_UI") == "1", "do not serve the console at /ui/ (WICKET_NO_UI=1)")
	fs.BoolVar(&o.ui.secureCookie, "ui-secure-cookie", os.Getenv("WICKET_UI_SECURE_COOKIE") == "1", "mark the console's session cookie Secure on plain HTTP too, behind a proxy that terminates TLS (WICKET_UI_SECURE_COOKIE=1)")
	fs.StringVar(&o.llm.addr, "llm-addr", envString("WICKET_LLM_ADDR", ""), "serve the LLM gateway on this address only, instead of under /llm/ of --addr (WICKET_LLM_ADDR)")
	fs.Int64Var(&o.llm.maxBody, "llm-max-body", int64(envInt("WICKET_LLM_MAX_BODY", int(llmgw.DefaultMaxBodyBytes))), "largest LLM gateway request body in bytes (WICKET_LLM_MAX_BODY)")
	fs.DurationVar(&o.llm.upstreamTimeout, "llm-upstream-timeout", envDuration("WICKET_LLM_UPSTREAM_TIMEOUT", llmgw.DefaultUpstreamTimeout), "longest provider call, stream included (WICKET_LLM_UPSTREAM_TIMEOUT)")
	fs.StringVar(&o.readyFile, "ready-file", envString("WICKET_READY_FILE", ""), "write the bound address to this file once serving (tests, supervisors) (WICKET_READY_FILE)")
	limitFlags(&o.limits, fs)
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

// listenError says which flag's address could not be listened on, without
// repeating the address as net.OpError does, and what to do when another
// process holds the port.
func listenError(flagName, addr string, err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		err = op.Err
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("serve: %s %s: %w (another process listens there: stop it or choose another %s)", flagName, addr, err, flagName)
	}
	return fmt.Errorf("serve: %s %s: %w", flagName, addr, err)
}

// checkListenAddr refuses a listen address no machine could listen on:
// no port, a port past 65535, a service name the system does not know.
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return err
	}
	return nil
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

// checkFlags refuses, before anything is opened or created, a size, count
// or timeout flag that is zero or negative (below them, a zero would
// silently mean the default and a negative one would expire approvals at
// once or time every webhook out) and the flags whose values are
// malformed whatever the store holds.
func (o *serveOptions) checkFlags() error {
	for _, f := range []struct {
		name string
		val  int64
	}{
		{"max-body", o.maxBody}, {"max-bundle-body", o.net.maxBundleBody}, {"llm-max-body", o.llm.maxBody},
		{"max-conns", int64(o.net.maxConns)}, {"max-streams-per-tenant", int64(o.net.maxStreamsPerTenant)},
		{"dispatch-max-attempts", int64(o.dispatchMaxAttempts)},
	} {
		if f.val <= 0 {
			return usageError{fmt.Sprintf("serve: --%s %d: want a positive number", f.name, f.val)}
		}
	}
	for _, f := range []struct {
		name string
		val  time.Duration
	}{
		{"lease-timeout", o.leaseTimeout}, {"dispatch-timeout", o.dispatchTimeout}, {"approval-timeout", o.approvalTimeout},
		{"read-header-timeout", o.net.readHeaderTimeout}, {"read-timeout", o.net.readTimeout}, {"idle-timeout", o.net.idleTmo},
		{"llm-upstream-timeout", o.llm.upstreamTimeout}, {"retention-interval", o.retentionInterval},
	} {
		if f.val <= 0 {
			return usageError{fmt.Sprintf("serve: --%s %s: want a positive duration", f.name, f.val)}
		}
	}
	// What needs no store is checked before the data directory is made.
	for _, f := range []struct{ name, addr string }{
		{"addr", o.addr}, {"metrics-addr", o.metricsAddr}, {"llm-addr", o.llm.addr}, {"pprof", o.pprofAddr},
	} {
		if err := checkListenAddr(f.addr); f.addr != "" && err != nil {
			return usageError{fmt.Sprintf("serve: --%s %s: %v (want HOST:PORT, e.g. 127.0.0.1:8080)", f.name, f.addr, err)}
		}
	}
	switch {
	case o.retention < 0 || (o.retention > 0 && o.retention < kernel.MinRetention):
		return usageError{fmt.Sprintf("serve: --retention %s: want 0 (keep forever) or at least %s", o.retention, kernel.MinRetention)}
	case kernel.ApprovalExpiry(o.approvalExpiry) != kernel.ExpireFailsExecution && kernel.ApprovalExpiry(o.approvalExpiry) != kernel.ExpireDeniesStep:
		return usageError{fmt.Sprintf("serve: --approval-expiry %q: want %s or %s", o.approvalExpiry, kernel.ExpireFailsExecution, kernel.ExpireDeniesStep)}
	case o.limits.regoIsolation != "process" && o.limits.regoIsolation != "none":
		return usageError{fmt.Sprintf("serve: --rego-isolation %q: want process or none", o.limits.regoIsolation)}
	case o.store != "" && !isPostgres(o.store):
		return usageError{fmt.Sprintf("serve: --store %q: want a postgres:// URL, or nothing for the embedded store under --data", redactSpec(o.store))}
	}
	switch o.defaultPolicy {
	case "", "allow", "deny":
	default:
		if !kernel.ValidBundleName(o.defaultPolicy) {
			return usageError{fmt.Sprintf("serve: --default-policy %q: want allow, deny or a bundle name", o.defaultPolicy)}
		}
	}
	return nil
}

// serve runs the kernel until ctx ends.
func serve(ctx context.Context, o *serveOptions, stdout, stderr io.Writer) error {
	log, err := newLogger(o.logLevel, o.logFormat, stderr)
	if err != nil {
		return err
	}
	if err := o.checkFlags(); err != nil {
		return err
	}
	defer startGCHeadroom(gcHeadroom)()
	var man *manifest.Manifest
	if o.config != "" {
		if man, err = manifest.Load(o.config, nil); err != nil {
			return err
		}
	}
	if o.llm.addr != "" && (man == nil || len(man.LLMProviders) == 0) {
		return usageError{"serve: --llm-addr needs llm_providers in the manifest (--config)"}
	}
	if o.adminKeyFile != "" {
		if o.adminKey != "" {
			return usageError{"serve: give --admin-key or --admin-key-file, not both"}
		}
		if o.adminKey, err = readKeyFile(o.adminKeyFile, log); err != nil {
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
		return usageError{fmt.Sprintf("serve: refusing to listen on %s without an API key: set --admin-key-file (or --admin-key, WICKET_ADMIN_KEY) or bind a loopback address", o.addr)}
	}
	if o.signatureTolerance <= 0 {
		return usageError{"serve: --signature-tolerance must be positive"}
	}
	if o.adminKey != "" && len(o.adminKey) < minAdminKey {
		return usageError{fmt.Sprintf("serve: --admin-key is %d bytes; it must be at least %d", len(o.adminKey), minAdminKey)}
	}
	limits, err := o.limits.limits()
	if err != nil {
		return err
	}

	if o.pprofAddr != "" && !isLoopback(o.pprofAddr) {
		return usageError{fmt.Sprintf("serve: --pprof %s: the profiler listens on a loopback address only (127.0.0.1:PORT)", o.pprofAddr)}
	}
	guard, err := webhookGuard(*o)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.data, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	for _, d := range []string{o.data, filepath.Join(o.data, "wasm-cache")} {
		if err := checkPrivateDir(d); err != nil {
			return err
		}
	}
	reg := metrics.New()
	t0 := time.Now()
	st, err := openStore(ctx, o.store, o.data, o.noSync, o.noWAL, o.commitEvery, reg.Commit)
	if err != nil {
		return err
	}
	defer st.Close()
	if st.bolt != nil {
		var size int64
		if fi, err := os.Stat(st.bolt.Path()); err == nil {
			size = fi.Size()
		}
		log.Info("store opened", "path", st.bolt.Path(), "size", bytesString(size), "schema", bbolt.SchemaVersion, "fsync", !o.noSync, "wal", !o.noSync && !o.noWAL,
			"took", time.Since(t0).Round(time.Millisecond).String())
	} else {
		log.Info("store opened", "store", st.kind, "at", st.desc, "schema", postgres.SchemaVersion, "synchronous_commit", !o.noSync,
			"took", time.Since(t0).Round(time.Millisecond).String())
	}

	// The kernel's own address is a forbidden webhook destination from the
	// start (the manifest registers agents before the listener opens);
	// SetSelf is called again with the bound address below.
	if self, err := net.ResolveTCPAddr("tcp", o.addr); err == nil && self.Port != 0 {
		guard.SetSelf(self)
	}

	providers, err := llmProviders(man)
	if err != nil {
		return err
	}
	if len(providers) == 0 && o.llm.addr != "" {
		return usageError{"serve: --llm-addr needs llm_providers in the manifest (--config)"}
	}
	if o.replica == "" && st.kind == "postgres" {
		host, _ := os.Hostname()
		o.replica = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	cfg := kernel.Config{Replica: o.replica, LeaseTimeout: o.leaseTimeout, DispatchTimeout: o.dispatchTimeout, DispatchMaxAttempts: o.dispatchMaxAttempts,
		ApprovalTimeout: o.approvalTimeout, ApprovalExpiry: kernel.ApprovalExpiry(o.approvalExpiry), Logger: log, Observer: reg,
		BundleLoadTimeout: o.limits.bundleLoadTimeout, BundleLoadTenantBudget: o.limits.bundleLoadTenantBudget, Retention: o.retention, RetentionInterval: o.retentionInterval,
		LLMGatewayTokens: len(providers) > 0, MaxTenantBundles: o.limits.tenantBundles, MaxTenantBundleBytes: int64(o.limits.tenantBundleBytes),
		MaxTenantAgents: o.limits.tenantAgents, MaxTenantKeys: o.limits.tenantKeys}
	if o.dispatchTimeout >= o.leaseTimeout {
		cfg.DispatchTimeout = o.leaseTimeout / 2
	}
	sender := webhook.New(webhook.WithGuard(guard))
	defer sender.Close()
	wasmCache := filepath.Join(o.data, "wasm-cache")
	wasmEngine := wasm.New(wasm.Config{CacheDir: wasmCache, CacheMaxBytes: int64(o.limits.cacheMax), Limits: limits,
		Builtins: rego.NewHostBuiltins(), Logger: log})
	defer wasmEngine.Close()
	kernelKeys, err := o.verificationKeys()
	if err != nil {
		return err
	}
	wasmEng, err := isolateWasm(&o.limits, wasmEngine, wasmCache, limits)
	if err != nil {
		return err
	}
	regoEng, closeRego, err := regoEngine(&o.limits, limits, log)
	if err != nil {
		return err
	}
	defer closeRego()
	host := plugins.NewHost(plugins.Options{DefaultPolicy: o.defaultPolicy, Limits: limits, BundleKeys: kernelKeys},
		rules.New(), regoEng, wasmEng)
	defer host.Close()
	k, err := kernel.New(st.Store, sender, host, host, cfg) // the store itself: kernel.Feed is found on it
	if err != nil {
		return usageError{err.Error()}
	}
	if err := k.LoadBundles(ctx); err != nil {
		return err
	}
	// Everything stored is compiled: the cache keeps only what it uses.
	if err := wasmEngine.PruneCache(); err != nil {
		log.Warn("wasm cache", "err", err)
	}
	if man != nil {
		if err := man.Apply(ctx, k); err != nil {
			return fmt.Errorf("apply manifest %s: %w", o.config, err)
		}
		log.Info("manifest applied", "path", o.config, "agents", len(man.Agents), "tenants", len(man.Tenants), "bundles", len(man.Bundles))
	}
	// Bundles pulled from bundle servers (OPA's protocol). Every connection
	// is checked after DNS, redirects included.
	// The same address policy as webhook URLs (--webhook-deny-cidr,
	// --webhook-allow-cidr; the kernel's own listener refused).
	puller := pull.New(pull.KernelActivator(k), pull.Options{Logger: log, Client: pull.GuardedClient(guard.Control), CheckURL: guard.CheckURL})
	defer puller.Close()
	k.SetBundlePuller(puller)
	stored, err := k.BundleSources(ctx)
	if err != nil {
		return err
	}
	for _, b := range stored { // set over the API before this boot
		if err := puller.Start(pull.FromRecord(b)); err != nil {
			log.Warn("cannot resume pulling a bundle", "tenant", b.Tenant, "bundle", b.Name, "err", err)
		}
	}
	if man != nil {
		for _, src := range man.Sources() {
			if err := puller.Start(src); err != nil {
				return fmt.Errorf("manifest %s: bundle %s: %w", o.config, src.Name, err)
			}
			log.Info("pulling bundle", "tenant", src.Tenant, "bundle", src.Name, "url", src.RedactedURL())
		}
	}
	if err := checkDefaultPolicy(ctx, k, o.defaultPolicy, log); err != nil {
		return err
	}

	maxConns := fitConns(o.net.maxConns, log)
	var srv *server.Server
	scfg := server.Config{AdminKey: o.adminKey, AuthDisabled: !keysConfigured, MaxBodyBytes: o.maxBody, Logger: log,
		MaxBundleBytes: o.net.maxBundleBody, ReadHeaderTimeout: o.net.readHeaderTimeout, ReadTimeout: o.net.readTimeout,
		IdleTimeout: o.net.idleTmo, MaxConns: maxConns, MaxStreamsPerTenant: o.net.maxStreamsPerTenant,
		SignatureTolerance: o.signatureTolerance,
		Metrics:            reg, MetricsKey: o.metricsKey, MetricsElsewhere: o.metricsAddr != ""}
	if st.bolt != nil { // PostgreSQL is backed up with its own tools (docs/operations.md)
		scfg.Backup = st.bolt
	}
	if err := reg.PendingApprovals(k.PendingApprovals); err != nil {
		return err
	}
	if len(providers) > 0 {
		gw, err := llmgw.New(k, llmgw.Config{Providers: providers, MaxBodyBytes: o.llm.maxBody, UpstreamTimeout: o.llm.upstreamTimeout, Logger: log,
			Deltas: func(id string, d wire.StepDeltaEvent) int { return srv.PublishDelta(id, d) }})
		if err != nil {
			return usageError{"serve: llm_providers: " + err.Error()}
		}
		scfg.LLM, scfg.LLMOwnListener = gw, o.llm.addr != ""
		log.Info("llm gateway", "providers_per_tenant", gw.Tenants(), "addr", cmp.Or(o.llm.addr, o.addr))
	}
	if !o.ui.disabled {
		scfg.UI = console.Handler(console.Options{SecureCookie: o.ui.secureCookie, Logger: log})
	}
	srv = server.New(k, scfg)
	if !keysConfigured {
		log.Warn("no API key configured: client and admin authentication is DISABLED; serving loopback only", "addr", o.addr)
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return listenError("--addr", o.addr, err)
	}
	self := []net.Addr{ln.Addr()}
	var mln net.Listener
	if o.metricsAddr != "" {
		if mln, err = net.Listen("tcp", o.metricsAddr); err != nil {
			ln.Close()
			return listenError("--metrics-addr", o.metricsAddr, err)
		}
		self = append(self, mln.Addr())
	}
	var lln net.Listener // the LLM gateway's own listener (--llm-addr)
	if o.llm.addr != "" {
		if lln, err = net.Listen("tcp", o.llm.addr); err != nil {
			ln.Close()
			if mln != nil {
				mln.Close()
			}
			return listenError("--llm-addr", o.llm.addr, err)
		}
		self = append(self, lln.Addr())
	}
	guard.SetSelf(self...)
	hs := srv.HTTPServer()                                         // timeouts, idle eviction, CloseStreams on shutdown
	hs.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn) // net/http: accept errors and the like
	ln = srv.Listener(ln)
	if o.pprofAddr != "" {
		stop, err := servePprof(o.pprofAddr, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	if err := k.Start(ctx); err != nil {
		return err
	}
	srv.SetReady(true)
	log.Info("wicket serving", "version", version, "data", o.data, "auth", keysConfigured, "store", st.kind, "at", st.desc, "replica", o.replica)
	if o.readyFile != "" {
		if err := os.WriteFile(o.readyFile, []byte(ln.Addr().String()), 0o600); err != nil {
			return fmt.Errorf("write ready file: %w", err)
		}
	}
	log.Info("listening on", "url", "http://"+ln.Addr().String())

	errc := make(chan error, 3)
	go func() { errc <- hs.Serve(ln) }()
	if mln != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", srv.MetricsHandler())
		ms := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
		defer ms.Close()
		go func() { errc <- ms.Serve(mln) }()
		log.Info("metrics listening on", "url", "http://"+mln.Addr().String()+"/metrics")
	}
	var lhs *http.Server
	if lln != nil {
		lhs = srv.HTTPServer()
		lhs.Handler = srv.LLMHandler()
		lhs.ErrorLog = hs.ErrorLog
		go func() { errc <- lhs.Serve(srv.Listener(lln)) }()
		log.Info("llm gateway listening", "addr", lln.Addr().String())
		fmt.Fprintf(stdout, "wicket llm gateway listening on http://%s/llm/\n", lln.Addr())
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "wait", shutdownWait.String(), "hint", "a second SIGINT or SIGTERM stops at once")
	stopNow := func(sig os.Signal) {
		log.Warn("second signal: stopping at once, without waiting for requests in progress (the next start applies the store's log)", "signal", sig.String())
	}
	onSecondSignal.Store(&stopNow)
	defer onSecondSignal.Store(nil)
	srv.SetReady(false)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownWait)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("http shutdown", "err", err)
	}
	if lhs != nil {
		if err := lhs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("llm gateway shutdown", "err", err)
		}
	}
	if err := k.Close(sctx); err != nil {
		log.Warn("kernel shutdown", "err", err)
	}
	log.Info("stopped")
	return nil
}

// shutdownWait bounds a graceful stop: the requests in progress (event
// streams are ended at once), then the kernel's own shutdown.
const shutdownWait = 15 * time.Second

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

// verificationKeys reads --bundle-verification-key (none when unset).
func (o *serveOptions) verificationKeys() ([]bundle.Key, error) {
	if o.bundleKeyFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(o.bundleKeyFile)
	if err != nil {
		return nil, usageError{fmt.Sprintf("--bundle-verification-key: %v", err)}
	}
	keys := []bundle.Key{{ID: o.bundleKeyID, Algorithm: o.bundleKeyAlg, Key: string(pem)}}
	if err := bundle.ValidateKeys(keys); err != nil {
		return nil, usageError{fmt.Sprintf("--bundle-verification-key %s: %v", o.bundleKeyFile, err)}
	}
	return keys, nil
}

// checkDefaultPolicy refuses a --default-policy that names a bundle the
// default tenant does not hold (it would deny every step of every unbound
// agent), and warns about each tenant that lacks it: the name is looked up
// in the agent's own tenant.
func checkDefaultPolicy(ctx context.Context, k *kernel.Kernel, name string, log *slog.Logger) error {
	switch name {
	case "", "allow", "deny":
		return nil
	}
	if !kernel.ValidBundleName(name) {
		return usagef("--default-policy %q: want allow, deny or a bundle name", name)
	}
	if _, err := k.GetBundle(ctx, kernel.DefaultTenant, name); err != nil {
		return fmt.Errorf("--default-policy %q names no bundle of the default tenant: upload it first (wicket bundle put, or the manifest's bundles): %w", name, err)
	}
	ts, err := k.ListTenants(ctx)
	if err != nil {
		return err
	}
	for _, t := range ts {
		if _, err := k.GetBundle(ctx, t.ID, name); err != nil {
			log.Warn("the default policy bundle is missing from a tenant: its unbound agents fail closed", "tenant", t.ID, "bundle", name)
		}
	}
	return nil
}

// minAdminKey is the shortest admin key serve accepts, in bytes.
const minAdminKey = 16

// readKeyFile reads the admin key from a file (one line; surrounding
// whitespace is dropped), so that it is not on the command line for ps to
// show. A file others may read is logged as a warning: it is the kernel's
// master key.
func readKeyFile(path string, log *slog.Logger) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("--admin-key-file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		log.Warn("the admin key file is readable by group or others: chmod 600 it", "path", path, "mode", st.Mode().Perm().String())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--admin-key-file: %w", err)
	}
	key := strings.TrimSpace(string(b))
	if key == "" {
		return "", usageError{fmt.Sprintf("serve: --admin-key-file %s is empty", path)}
	}
	if strings.ContainsAny(key, "\r\n") {
		return "", usageError{fmt.Sprintf("serve: --admin-key-file %s holds more than one line", path)}
	}
	if len(key) < minAdminKey {
		return "", usageError{fmt.Sprintf("serve: the key in --admin-key-file %s is %d bytes; it must be at least %d (openssl rand -hex 32 > %[1]s)", path, len(key), minAdminKey)}
	}
	return key, nil
}

// fdReserve are the file descriptors kept for the store, the wasm cache,
// webhooks and logs when --max-conns is fitted to the process's limit.
const fdReserve = 128

// fitConns lowers max so that max open connections plus fdReserve fit the
// process's file descriptor limit: past it, accept fails ("too many open
// files") and nobody is served, where the connection limit closes idle
// connections for room instead.
func fitConns(max int, log *slog.Logger) int {
	lim, ok := fdLimit()
	if !ok || uint64(max)+fdReserve <= lim {
		return max
	}
	fit := 16
	if lim > fdReserve+16 {
		fit = int(lim - fdReserve)
	}
	log.Warn("--max-conns lowered to fit the file descriptor limit (raise ulimit -n to allow more)", "max_conns", max, "fd_limit", lim, "now", fit)
	return fit
}

// llmProviders reads the manifest's llm_providers with their keys.
func llmProviders(man *manifest.Manifest) ([]llmgw.Provider, error) {
	if man == nil {
		return nil, nil
	}
	var out []llmgw.Provider
	for _, p := range man.LLMProviders {
		key, err := man.LLMKey(p)
		if err != nil {
			return nil, err
		}
		lp := llmgw.Provider{Name: p.Name, Tenant: p.Tenant, Dialect: p.Dialect, BaseURL: p.BaseURL, APIKey: key, IdempotencyHeader: p.IdempotencyHeader}
		for _, m := range p.Models {
			lp.Models = append(lp.Models, llmgw.Model{Name: m.Name, Input: m.Input, Output: m.Output})
		}
		out = append(out, lp)
	}
	return out, nil
}
