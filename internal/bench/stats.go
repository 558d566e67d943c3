// Package bench measures sandkeep against the raw Docker Engine API, side by side in one process and one run:
// each scenario alternates a sandkeep sample with a baseline sample so that machine noise hits both alike,
// and reports medians, p90, p99 and the ratio of medians. Timings are reported, never asserted.
package bench

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Stats summarises one series of samples.
type Stats struct {
	N      int           `json:"n"`
	Median time.Duration `json:"median_ns"`
	P90    time.Duration `json:"p90_ns"`
	P99    time.Duration `json:"p99_ns"`
}

// Summarise computes the order statistics of samples (nearest-rank).
func Summarise(samples []time.Duration) Stats {
	if len(samples) == 0 {
		return Stats{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.5) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return Stats{N: len(s), Median: rank(0.5), P90: rank(0.9), P99: rank(0.99)}
}

// Result is one scenario: sandkeep's series, the baseline's, and the ratio of their medians.
type Result struct {
	Scenario string            `json:"scenario"`
	Baseline string            `json:"baseline"`
	Sandkeep Stats             `json:"sandkeep"`
	Base     Stats             `json:"base"`
	Ratio    float64           `json:"ratio"` // sandkeep median / baseline median
	Extra    map[string]string `json:"extra,omitempty"`
}

func newResult(scenario, baseline string, sk, base []time.Duration) Result {
	r := Result{Scenario: scenario, Baseline: baseline, Sandkeep: Summarise(sk), Base: Summarise(base)}
	if r.Base.Median > 0 {
		r.Ratio = float64(r.Sandkeep.Median) / float64(r.Base.Median)
	}
	return r
}

// String is one Markdown table row: scenario | baseline | sandkeep median/p90/p99 | baseline median/p90/p99 |
// ratio | notes (Extra as k=v, sorted by key).
func (r Result) String() string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }
	keys := make([]string, 0, len(r.Extra))
	for k := range r.Extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	notes := make([]string, 0, len(keys))
	for _, k := range keys {
		notes = append(notes, k+"="+r.Extra[k])
	}
	return fmt.Sprintf("| %s | %s | %s / %s / %s | %s / %s / %s | %.3fx | %s |", r.Scenario, r.Baseline,
		ms(r.Sandkeep.Median), ms(r.Sandkeep.P90), ms(r.Sandkeep.P99),
		ms(r.Base.Median), ms(r.Base.P90), ms(r.Base.P99), r.Ratio, strings.Join(notes, " "))
}

// Header is the Markdown table header matching Result.String. The ratio is sandkeep's median over the
// baseline's: below 1 sandkeep is faster (0.05x is 20 times faster).
const Header = "| scenario | baseline | sandkeep ms (median / p90 / p99) | baseline ms (median / p90 / p99) | ratio (sandkeep / baseline) | notes |\n|---|---|---|---|---|---|"
