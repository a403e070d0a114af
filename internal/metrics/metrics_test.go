package metrics

import (
	"fmt"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
)

// counts gathers m's samples of family name by their labels
// ("engine=rules,decision=allow"): counters' values and histograms' counts.
func counts(t *testing.T, m *Metrics, name string) map[string]float64 {
	t.Helper()
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.GetMetric() {
			key := ""
			for _, l := range mt.GetLabel() {
				if key != "" {
					key += ","
				}
				key += l.GetName() + "=" + l.GetValue()
			}
			if h := mt.GetHistogram(); h != nil {
				out[key] = float64(h.GetSampleCount())
			} else {
				out[key] = mt.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestStepSeriesCached: StepDecided and StepSubmitted count under the same
// labels whether their series are cached or not: an empty engine is
// "none", and past the bound of distinct values a new one is "other".
func TestStepSeriesCached(t *testing.T) {
	m := New()
	for range 3 {
		m.StepDecided("rules", policy.Allow, time.Millisecond)
		m.StepDecided("", policy.Deny, time.Millisecond)
		m.StepSubmitted("proceed")
	}
	for i := range 14 { // 12 engines at most: "none", "rules", then 10 more
		m.StepDecided(fmt.Sprint("e", i), policy.Allow, 0)
	}
	m.StepDecided("e13", policy.Allow, 0) // seen as "other" before
	d := counts(t, m, "wicket_step_decisions_total")
	for k, want := range map[string]float64{"decision=allow,engine=rules": 3, "decision=deny,engine=none": 3,
		"decision=allow,engine=e9": 1, "decision=allow,engine=other": 5} {
		if d[k] != want {
			t.Errorf("decisions %s = %v, want %v (all: %v)", k, d[k], want, d)
		}
	}
	if e := counts(t, m, "wicket_policy_eval_seconds"); e["engine=rules"] != 3 || e["engine=other"] != 5 {
		t.Errorf("eval observations %v", e)
	}
	if s := counts(t, m, "wicket_step_submissions_total"); s["decision=proceed"] != 3 {
		t.Errorf("submissions %v", s)
	}
}

// TestSeriesCacheBounded: past maxCachedSeries distinct values the caches
// stop growing, and the values past it are still counted, each time.
func TestSeriesCacheBounded(t *testing.T) {
	m := New()
	for i := range 2 * maxCachedSeries {
		m.StepDecided(fmt.Sprint("e", i), policy.Action(fmt.Sprint("a", i)), 0)
		m.StepSubmitted(fmt.Sprint("d", i))
	}
	m.StepSubmitted(fmt.Sprint("d", 2*maxCachedSeries-1))
	if len(m.decided.m) > maxCachedSeries || len(m.submitted.m) > maxCachedSeries {
		t.Fatalf("caches hold %d and %d series, bound %d", len(m.decided.m), len(m.submitted.m), maxCachedSeries)
	}
	var total float64
	for _, v := range counts(t, m, "wicket_step_submissions_total") {
		total += v
	}
	if total != 2*maxCachedSeries+1 {
		t.Fatalf("%v submissions counted, want %d", total, 2*maxCachedSeries+1)
	}
}
