package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wicket-run/wicket/kernel"
)

// The feed tells the other replicas what a write transaction changed, with
// PostgreSQL's NOTIFY: the writer adds pg_notify calls to the transaction
// (one round trip with the COMMIT), and PostgreSQL delivers them to every
// listening connection when, and only if, the transaction commits, in
// commit order. Each store listens on one connection of its own
// (Store.Follow). The channel is named after the schema, so that stores in
// other schemas of the database (tests) do not hear each other.

// changes is what a layer's writes change, for the notifications.
type changes struct {
	executions map[string]bool
	// queued is whether each execution written is left with a queued
	// dispatch (the last write counts: one queued and claimed in the same
	// transaction is no news to the other dispatchers).
	queued  map[execRef]bool
	agents  map[kernel.Ref]bool
	bundles map[kernel.Ref]bool
	keys    map[kernel.Ref]bool // API keys revoked
}

func newChanges() changes {
	return changes{executions: map[string]bool{}, queued: map[execRef]bool{}, agents: map[kernel.Ref]bool{},
		bundles: map[kernel.Ref]bool{}, keys: map[kernel.Ref]bool{}}
}

// dispatch reports whether a dispatch is left queued.
func (c *changes) dispatch() bool {
	for _, q := range c.queued {
		if q {
			return true
		}
	}
	return false
}

func (c *changes) absorb(src changes) {
	for k := range src.executions {
		c.executions[k] = true
	}
	for k := range src.agents {
		c.agents[k] = true
	}
	for k := range src.bundles {
		c.bundles[k] = true
	}
	for k := range src.keys {
		c.keys[k] = true
	}
	for k, q := range src.queued {
		c.queued[k] = q
	}
}

// notice is the payload of one notification.
type notice struct {
	Origin     string       `json:"o"`
	Executions []string     `json:"e,omitempty"`
	Dispatch   bool         `json:"d,omitempty"`
	Agents     []kernel.Ref `json:"a,omitempty"`
	Bundles    []kernel.Ref `json:"b,omitempty"`
	Keys       []kernel.Ref `json:"k,omitempty"`
}

// maxNotice keeps a payload under PostgreSQL's limit (8000 bytes).
const maxNotice = 7000

const sqlNotify = `SELECT pg_notify($1, $2)`

// notifications returns the pg_notify statements announcing c: as few as
// fit under maxNotice each.
func (c *changes) notifications(channel, origin string) []statement {
	dispatch := c.dispatch()
	if len(c.executions) == 0 && !dispatch && len(c.agents) == 0 && len(c.bundles) == 0 && len(c.keys) == 0 {
		return nil
	}
	var out []statement
	n := notice{Origin: origin, Dispatch: dispatch}
	size := 0
	emit := func() {
		b, _ := json.Marshal(n)
		out = append(out, statement{sql: sqlNotify, args: []any{channel, string(b)}})
		n, size = notice{Origin: origin}, 0
	}
	full := func(add int) {
		if size+add > maxNotice {
			emit()
		}
		size += add
	}
	for _, r := range sortedRefs(c.agents) {
		full(len(r.Tenant) + len(r.Name) + 16)
		n.Agents = append(n.Agents, r)
	}
	for _, r := range sortedRefs(c.bundles) {
		full(len(r.Tenant) + len(r.Name) + 16)
		n.Bundles = append(n.Bundles, r)
	}
	for _, r := range sortedRefs(c.keys) {
		full(len(r.Tenant) + len(r.Name) + 16)
		n.Keys = append(n.Keys, r)
	}
	ids := make([]string, 0, len(c.executions))
	for id := range c.executions {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		full(len(id) + 3)
		n.Executions = append(n.Executions, id)
	}
	emit()
	return out
}

func sortedRefs(m map[kernel.Ref]bool) []kernel.Ref {
	out := make([]kernel.Ref, 0, len(m))
	for r := range m {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b kernel.Ref) int {
		if a.Tenant != b.Tenant {
			if a.Tenant < b.Tenant {
				return -1
			}
			return 1
		}
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

var _ kernel.Feed = (*Store)(nil)

// Follow implements kernel.Feed: it listens for the notifications of the
// other stores sharing the database (its own are skipped) and calls fn
// with each, until ctx ends. After every (re)connection it calls fn with
// Change.All, since notifications sent while it was not listening are
// lost; a broken connection is retried after a second.
func (s *Store) Follow(ctx context.Context, fn func(kernel.Change)) error {
	for {
		err := s.listen(ctx, fn)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.listenErrors.Add(1)
		_ = err // reported by Stats; the next connection follows
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// listen follows the channel on one connection until it fails.
func (s *Store) listen(ctx context.Context, fn func(kernel.Change)) error {
	conn, err := pgx.ConnectConfig(ctx, s.connConfig.Copy())
	if err != nil {
		return fmt.Errorf("postgres: listen: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		return fmt.Errorf("postgres: listen: %w", err)
	}
	fn(kernel.Change{All: true})
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("postgres: listen: %w", err)
		}
		var no notice
		if json.Unmarshal([]byte(n.Payload), &no) != nil || no.Origin == s.origin {
			continue
		}
		fn(kernel.Change{Executions: no.Executions, Dispatch: no.Dispatch, Agents: no.Agents, Bundles: no.Bundles, Keys: no.Keys})
	}
}
