package kernel

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
)

// window is the durable state of one rate-limit counter. Windows are
// aligned to multiples of the window length since the Unix epoch, so a fixed
// window means the same thing on every replica.
type window struct {
	Start int64 `json:"start"` // unix nanos of the current window's start
	Count int   `json:"count"` // calls admitted in the current window
	Prev  int   `json:"prev"`  // calls admitted in the previous window
}

// estimate returns how many calls the limiter counts at now.
//
// fixed: the calls of the current aligned window.
// sliding: the sliding-window-counter approximation: the current window's
// calls plus the previous window's weighted by how much of it still
// overlaps the last `length` of time.
func (w window) estimate(now time.Time, length time.Duration, sliding bool) float64 {
	if !sliding {
		return float64(w.Count)
	}
	elapsed := now.UnixNano() - w.Start
	overlap := 1 - float64(elapsed)/float64(length)
	// A window that starts after now (see roll) counts the previous one whole.
	overlap = min(max(overlap, 0), 1)
	return float64(w.Count) + float64(w.Prev)*overlap
}

// roll advances w to the window containing now. A counter already in a
// later window, at most one window ahead, stays there: the clock that
// counted it was ahead of this one (a clock stepped back across a restart,
// or another replica's), and moving the counter back would empty it. One
// further ahead (a clock that was set wrong, then put right) starts afresh
// rather than hold the limit shut until the clock reaches it.
func (w window) roll(now time.Time, length time.Duration) window {
	start := now.UnixNano() - now.UnixNano()%int64(length)
	switch {
	case w.Start == start || w.Start > start && w.Start-start <= int64(length):
		return w
	case w.Start == start-int64(length):
		return window{Start: start, Prev: w.Count}
	default:
		return window{Start: start}
	}
}

// rateLimit checks every limit and, when all admit the call, counts it in
// each (in the caller's transaction, so counting is exact and durable).
func (k *Kernel) rateLimit(r *rec, e *Execution, rules []RateLimitRule) (limited bool, reason, ruleID string, err error) {
	if len(rules) == 0 {
		return false, "", "", nil
	}
	type pending struct {
		key string
		w   window
	}
	var writes []pending
	for _, rl := range rules {
		length, perr := time.ParseDuration(rl.Window)
		if perr != nil || length <= 0 || rl.MaxCalls <= 0 {
			if rl.OnLimiterError == "fail_open" {
				continue
			}
			return true, fmt.Sprintf("rate limit %s is misconfigured (fail closed)", rl.ID), rl.ID, nil
		}
		var key, legacy string
		switch rl.Per {
		case policy.PerAgent:
			key = "rl\x00" + rl.ID + "\x00agent:" + e.AgentID
		case policy.PerTenant:
			key = "rl\x00" + rl.ID + "\x00tenant"
		default:
			// Kept under the execution, so that deleting it deletes them.
			key = ExecCounterPrefix(e.ID) + "rl\x00" + rl.ID
			legacy = "rl\x00" + rl.ID + "\x00exec:" + e.ID // before 0.2: read until rewritten
		}
		var w window
		raw, cerr := r.tx.Counter(e.Tenant, key)
		if cerr == nil && raw == nil && legacy != "" {
			raw, cerr = r.tx.Counter(e.Tenant, legacy)
		}
		if cerr == nil && raw != nil {
			cerr = json.Unmarshal(raw, &w)
		}
		if cerr != nil {
			if rl.OnLimiterError == "fail_open" {
				k.log.Warn("rate limiter error; failing open", "rate_limit", rl.ID, "err", cerr)
				continue
			}
			return true, fmt.Sprintf("rate limiter error for %s (fail closed): %v", rl.ID, cerr), rl.ID, nil
		}
		w = w.roll(r.now, length)
		if w.estimate(r.now, length, rl.Algorithm != "fixed") >= float64(rl.MaxCalls) {
			return true, fmt.Sprintf("rate limit %s: at most %d calls per %s per %s", rl.ID, rl.MaxCalls, length, perOr(rl.Per)), rl.ID, nil
		}
		w.Count++
		writes = append(writes, pending{key, w})
	}
	for _, p := range writes {
		b, _ := json.Marshal(p.w)
		if err := r.tx.PutCounter(e.Tenant, p.key, b); err != nil {
			return false, "", "", fmt.Errorf("put rate-limit counter: %w", err)
		}
	}
	return false, "", "", nil
}

func perOr(p string) string {
	if p == "" {
		return policy.PerExecution
	}
	return p
}
