// Package pull keeps bundles up to date from bundle servers, with OPA's
// bundle service protocol: poll a URL at a random delay between a minimum
// and a maximum, send the last ETag as If-None-Match, keep everything on
// 304, back off exponentially on errors, and activate a new download only
// once it loaded whole (signature verified, compiled). A bad download
// leaves the last good revision live.
//
// # Basics
//
//	p := pull.New(activate, pull.Options{Logger: log})
//	defer p.Close()
//	p.Start(pull.Source{Tenant: "acme", Name: "authz", URL: "https://bundles.example/authz.tar.gz"})
//
// activate is the kernel's PutBundle (see [Activator]): it verifies,
// compiles, stores and swaps in the archive, or refuses it whole.
package pull

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// OPA's polling defaults.
const (
	DefaultMinDelay = 60 * time.Second
	DefaultMaxDelay = 120 * time.Second
	// DefaultMaxBytes bounds a download (the compressed archive).
	DefaultMaxBytes = 32 << 20
	// DefaultTimeout bounds one request.
	DefaultTimeout = 30 * time.Second
	// DefaultBackoff is the first delay after a failure; it doubles with
	// each further failure, up to the source's MaxDelay.
	DefaultBackoff = time.Second
)

// Source is a bundle kept in sync with a URL.
type Source struct {
	// Tenant and Name are the bundle the downloads replace.
	Tenant string `json:"tenant"`
	Name   string `json:"name"`
	// URL serves the bundle's .tar.gz (http or https).
	URL string `json:"url"`
	// MinDelay and MaxDelay bound the random wait between polls (OPA's
	// polling.min_delay_seconds and max_delay_seconds; default 60s, 120s).
	MinDelay time.Duration `json:"min_delay,omitempty"`
	MaxDelay time.Duration `json:"max_delay,omitempty"`
	// Owner is whose the downloads are: kernel.BundleOwnerAdmin for the
	// manifest's sources and an admin's, kernel.BundleOwnerTenant for a
	// tenant-admin's (empty: the tenant's).
	Owner kernel.BundleOwner `json:"owner,omitempty"`
}

// Validate checks the URL (http or https, a host, no user info) and the
// delays (MinDelay ≤ MaxDelay, both ≥ 0).
func (s Source) Validate() error {
	u, err := url.Parse(s.URL)
	switch {
	case err != nil:
		return fmt.Errorf("source url: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("source url %q: want http or https", s.URL)
	case u.Host == "":
		return fmt.Errorf("source url %q: no host", s.URL)
	case u.User != nil:
		return fmt.Errorf("source url: credentials in the URL are not accepted")
	case s.MinDelay < 0 || s.MaxDelay < 0:
		return errors.New("source delays must not be negative")
	case s.MaxDelay != 0 && s.MinDelay > s.MaxDelay:
		return fmt.Errorf("source min_delay %s exceeds max_delay %s", s.MinDelay, s.MaxDelay)
	}
	return nil
}

func (s Source) key() string { return s.Tenant + "\x00" + s.Name }

func (s Source) delays() (time.Duration, time.Duration) {
	lo, hi := s.MinDelay, s.MaxDelay
	if lo == 0 && hi == 0 {
		return DefaultMinDelay, DefaultMaxDelay
	}
	if hi < lo {
		hi = lo
	}
	return lo, hi
}

// Activator loads an archive as src's bundle (src.Tenant, src.Name, as
// src.Owner's): it must verify, compile and store it and make it live, or
// refuse it whole and change nothing. It returns the revision and digest
// that went live.
type Activator func(ctx context.Context, src Source, archive []byte) (revision, digest string, err error)

// Options tune a Puller.
type Options struct {
	// Client makes the requests. Default: one whose transport refuses the
	// addresses webhook URLs may not reach either (see [GuardedClient]).
	Client *http.Client
	// Logger records every activation (revision, digest) and failure.
	Logger *slog.Logger
	// MaxBytes bounds a download (default [DefaultMaxBytes]).
	MaxBytes int64
	// Timeout bounds one request (default [DefaultTimeout]).
	Timeout time.Duration
	// Backoff is the first wait after a failure (default [DefaultBackoff]).
	Backoff time.Duration
	// CheckURL, when set, vets a URL given to Watch before anything is
	// fetched (e.g. resolving its host against the address policy), so a
	// refused address is reported at once.
	CheckURL func(ctx context.Context, rawURL string) error
}

// Status is what a source's last polls established.
type Status struct {
	Source Source `json:"source"`
	// ETag of the live download ("" before the first).
	ETag string `json:"etag,omitempty"`
	// Revision and Digest that the last activation made live.
	Revision string `json:"revision,omitempty"`
	Digest   string `json:"sha256,omitempty"`
	// Activations counts downloads made live; NotModified counts 304s.
	Activations int `json:"activations"`
	NotModified int `json:"not_modified"`
	// Failures counts consecutive failed polls; LastError is the latest.
	Failures  int    `json:"failures"`
	LastError string `json:"last_error,omitempty"`
}

// Puller polls sources. It is safe for concurrent use.
type Puller struct {
	activate Activator
	o        Options

	mu      sync.Mutex
	sources map[string]*running
	closed  bool
	wg      sync.WaitGroup
}

type running struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu sync.Mutex // one poll at a time; guards st
	st Status
}

// New returns a Puller that activates downloads with activate.
func New(activate Activator, o Options) *Puller {
	if o.Client == nil {
		o.Client = GuardedClient(nil)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Backoff <= 0 {
		o.Backoff = DefaultBackoff
	}
	return &Puller{activate: activate, o: o, sources: map[string]*running{}}
}

// Start polls src in the background until Stop or Close, replacing any
// earlier source of the same bundle. The first poll is immediate.
func (p *Puller) Start(src Source) error {
	return p.start(src, false)
}

// Watch implements kernel.BundlePuller: it downloads and activates the
// bundle now and, when that worked, polls it in the background (as Start).
// A URL whose host resolves to a refused address, or a first download
// that fails, registers nothing.
func (p *Puller) Watch(ctx context.Context, tenant, name string, bp kernel.BundlePull) error {
	src := Source{Tenant: tenant, Name: name, URL: bp.URL, Owner: bp.Owner}
	for _, d := range []struct {
		s   string
		dst *time.Duration
	}{{bp.MinDelay, &src.MinDelay}, {bp.MaxDelay, &src.MaxDelay}} {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil || v < time.Second {
			return fmt.Errorf("source delay %q: want a Go duration of at least 1s", d.s)
		}
		*d.dst = v
	}
	if err := src.Validate(); err != nil {
		return err
	}
	if p.o.CheckURL != nil {
		if err := p.o.CheckURL(ctx, src.URL); err != nil {
			return err
		}
	}
	return p.start(src, true)
}

// Unwatch implements kernel.BundlePuller (as Stop).
func (p *Puller) Unwatch(tenant, name string) { p.Stop(tenant, name) }

var _ kernel.BundlePuller = (*Puller)(nil)

func (p *Puller) start(src Source, syncFirst bool) error {
	if err := src.Validate(); err != nil {
		return err
	}
	st := Status{Source: src}
	if syncFirst {
		r := &running{st: st}
		if err := p.poll(context.Background(), r); err != nil {
			return err
		}
		st = r.st
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("pull: closed")
	}
	old := p.sources[src.key()]
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{}), st: st}
	if old != nil {
		old.cancel()
		if !syncFirst {
			old.mu.Lock()
			if old.st.Source.URL == src.URL {
				r.st.ETag, r.st.Revision, r.st.Digest = old.st.ETag, old.st.Revision, old.st.Digest
			}
			old.mu.Unlock()
		}
	}
	p.sources[src.key()] = r
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(r.done)
		if old != nil {
			<-old.done
		}
		p.loop(ctx, r, syncFirst)
	}()
	return nil
}

// Stop stops polling a bundle (its live revision stays).
func (p *Puller) Stop(tenant, name string) {
	p.mu.Lock()
	r := p.sources[tenant+"\x00"+name]
	delete(p.sources, tenant+"\x00"+name)
	p.mu.Unlock()
	if r != nil {
		r.cancel()
		<-r.done
	}
}

// Close stops every source and waits for their polls to end.
func (p *Puller) Close() {
	p.mu.Lock()
	p.closed = true
	for k, r := range p.sources {
		r.cancel()
		delete(p.sources, k)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Status returns a source's status.
func (p *Puller) Status(tenant, name string) (Status, bool) {
	p.mu.Lock()
	r := p.sources[tenant+"\x00"+name]
	p.mu.Unlock()
	if r == nil {
		return Status{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st, true
}

// Sources lists the sources being polled.
func (p *Puller) Sources() []Status {
	p.mu.Lock()
	rs := make([]*running, 0, len(p.sources))
	for _, r := range p.sources {
		rs = append(rs, r)
	}
	p.mu.Unlock()
	out := make([]Status, 0, len(rs))
	for _, r := range rs {
		r.mu.Lock()
		out = append(out, r.st)
		r.mu.Unlock()
	}
	return out
}

func (p *Puller) loop(ctx context.Context, r *running, polled bool) {
	for {
		var err error
		if !polled {
			err = p.poll(ctx, r)
		}
		polled = false
		if ctx.Err() != nil {
			return
		}
		r.mu.Lock()
		src, failures := r.st.Source, r.st.Failures
		r.mu.Unlock()
		lo, hi := src.delays()
		wait := lo
		if hi > lo {
			wait += rand.N(hi - lo + 1)
		}
		if err != nil {
			wait = p.backoff(failures, hi)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// backoff is the wait after the n-th consecutive failure: Backoff doubled
// n-1 times, capped at max, with up to 20% jitter taken off.
func (p *Puller) backoff(n int, max time.Duration) time.Duration {
	d := p.o.Backoff
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if max > 0 && d > max {
		d = max
	}
	if j := int64(d) / 5; j > 0 {
		d -= time.Duration(rand.Int64N(j))
	}
	return d
}

// PollOnce polls tenant/name's source now (it must have been started) and
// returns what happened: nil after an activation or a 304.
func (p *Puller) PollOnce(ctx context.Context, tenant, name string) error {
	p.mu.Lock()
	r := p.sources[tenant+"\x00"+name]
	p.mu.Unlock()
	if r == nil {
		return fmt.Errorf("pull: no source for bundle %s/%s", tenant, name)
	}
	return p.poll(ctx, r)
}

// errNotModified is a 304.
var errNotModified = errors.New("not modified")

func (p *Puller) poll(ctx context.Context, r *running) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	src := r.st.Source
	shown := src.RedactedURL() // never the query: it may carry a token
	archive, etag, err := p.download(ctx, src, r.st.ETag)
	switch {
	case errors.Is(err, errNotModified):
		r.st.NotModified++
		r.st.Failures, r.st.LastError = 0, ""
		p.o.Logger.Debug("bundle not modified", "tenant", src.Tenant, "bundle", src.Name, "url", shown, "etag", r.st.ETag)
		return nil
	case err == nil:
		var rev, digest string
		rev, digest, err = p.activate(ctx, src, archive)
		if err == nil {
			r.st.ETag, r.st.Revision, r.st.Digest = etag, rev, digest
			r.st.Activations++
			r.st.Failures, r.st.LastError = 0, ""
			p.o.Logger.Info("bundle activated", "tenant", src.Tenant, "bundle", src.Name, "revision", rev, "sha256", digest, "url", shown, "etag", etag)
			return nil
		}
		err = fmt.Errorf("bundle refused: %w", err)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	r.st.Failures++
	r.st.LastError = err.Error()
	p.o.Logger.Warn("bundle download failed; the live revision stays", "tenant", src.Tenant, "bundle", src.Name, "url", shown,
		"live_revision", r.st.Revision, "live_sha256", r.st.Digest, "failures", r.st.Failures, "err", err)
	return err
}

// download fetches src's archive; errNotModified on a 304.
func (p *Puller) download(ctx context.Context, src Source, etag string) ([]byte, string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, src.URL, nil)
	if err != nil {
		return nil, "", scrubURL(err, src)
	}
	req.Header.Set("Accept", "application/gzip, application/octet-stream")
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	resp, err := p.o.Client.Do(req)
	if err != nil {
		return nil, "", scrubURL(err, src) // net/http words it with the whole URL
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotModified:
		return nil, "", errNotModified
	case resp.StatusCode != http.StatusOK:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return nil, "", fmt.Errorf("GET %s: %s", redact(src.URL), resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, p.o.MaxBytes+1))
	if err != nil {
		return nil, "", fmt.Errorf("GET %s: reading the body: %w", redact(src.URL), err)
	}
	if int64(len(body)) > p.o.MaxBytes {
		return nil, "", fmt.Errorf("GET %s: the bundle is larger than %d bytes", redact(src.URL), p.o.MaxBytes)
	}
	return body, resp.Header.Get("ETag"), nil
}

// RedactedURL is the source's URL as logs and messages show it: without
// its query and fragment, which may carry a token.
func (s Source) RedactedURL() string { return redact(s.URL) }

// scrubURL replaces the URL in a *url.Error of net/http or net/url with
// the source's redacted one.
func scrubURL(err error, src Source) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = src.RedactedURL()
	}
	return err
}

// redact drops the query (it may carry a token) from a URL for messages.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(bad url)"
	}
	u.RawQuery, u.Fragment = "", ""
	return u.String()
}

// FromRecord is the source a stored bundle names (its delays as parsed;
// bad ones fall back to the defaults).
func FromRecord(b *kernel.BundleRecord) Source {
	s := Source{Tenant: b.Tenant, Name: b.Name}
	if b.Source == nil {
		return s
	}
	s.URL, s.Owner = b.Source.URL, b.Source.Owner
	if s.Owner == "" {
		s.Owner = b.OwnedBy()
	}
	s.MinDelay, _ = time.ParseDuration(b.Source.MinDelay)
	s.MaxDelay, _ = time.ParseDuration(b.Source.MaxDelay)
	return s
}

// Kernel is the part of the kernel an activator needs.
type Kernel interface {
	PutBundle(ctx context.Context, tenant, name string, src kernel.BundleSource, owner kernel.BundleOwner) (*kernel.BundleRecord, error)
}

// KernelActivator activates downloads with k.PutBundle: verified (with
// the tenant's keys), compiled, stored as the source owner's and swapped
// in, or refused whole (a tenant's download may not replace a bundle the
// admin owns).
func KernelActivator(k Kernel) Activator {
	return func(ctx context.Context, src Source, archive []byte) (string, string, error) {
		owner := src.Owner
		if owner == "" {
			owner = kernel.BundleOwnerTenant
		}
		rec, err := k.PutBundle(ctx, src.Tenant, src.Name, kernel.BundleSource{Archive: archive, Name: src.Name}, owner)
		if err != nil {
			return "", "", err
		}
		return rec.Revision, rec.Digest, nil
	}
}
