// Package doctor runs the checks that tell an operator, before a run, whether a spec can be honoured on this
// machine and how to fix it when not. A check is a named probe with its own timeout; its result is pass, warn
// or fail with a detail and, unless it passed, a fix line.
package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Status is a check's verdict.
type Status string

// Statuses.
const (
	Pass Status = "pass"
	Warn Status = "warn"
	Fail Status = "fail"
	Skip Status = "skip" // not run: an earlier check it depends on failed
)

// DefaultTimeout bounds each probe.
const DefaultTimeout = 5 * time.Second

// Result is one check's outcome.
type Result struct {
	Name     string        `json:"name"`
	Status   Status        `json:"status"`
	Code     string        `json:"code,omitempty"` // a diag code (SKnnn) when the check has one for its verdict
	Detail   string        `json:"detail,omitempty"`
	Fix      string        `json:"fix,omitempty"`
	Duration time.Duration `json:"duration_ns"`
}

// Check is one probe. Run honours ctx (which carries the probe's timeout) and returns its verdict; Needs names
// checks that must have passed (or warned) for this one to run.
type Check struct {
	Name  string
	Needs []string
	Run   func(ctx context.Context) Result
	// Timeout, when set, replaces Run's timeout for this check (one that starts a pod, say).
	Timeout time.Duration
}

// Run runs checks in order, each under its own timeout, skipping those whose needs did not pass.
func Run(ctx context.Context, checks []Check, timeout time.Duration) []Result {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ok := map[string]bool{}
	out := make([]Result, 0, len(checks))
	for _, c := range checks {
		if missing := unmet(c.Needs, ok); missing != "" {
			out = append(out, Result{Name: c.Name, Status: Skip, Detail: "needs " + missing})
			continue
		}
		t := timeout
		if c.Timeout > 0 {
			t = c.Timeout
		}
		r := runOne(ctx, c, t)
		ok[c.Name] = r.Status == Pass || r.Status == Warn
		out = append(out, r)
	}
	return out
}

func unmet(needs []string, ok map[string]bool) string {
	for _, n := range needs {
		if !ok[n] {
			return n
		}
	}
	return ""
}

func runOne(ctx context.Context, c Check, timeout time.Duration) Result {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	done := make(chan Result, 1) // room for the result even when the probe outlives its timeout
	go func() { done <- c.Run(cctx) }()
	var r Result
	select {
	case r = <-done:
	case <-cctx.Done():
		r = Result{Status: Fail, Detail: fmt.Sprintf("no answer within %s", timeout),
			Fix: "check that the service this probe talks to is up and reachable"}
	}
	r.Name = c.Name
	r.Duration = time.Since(start)
	return r
}

// ExitCode is doctor's exit status: 0 when nothing failed, 1 otherwise. (2, bad usage, is the CLI's.)
func ExitCode(results []Result) int {
	for _, r := range results {
		if r.Status == Fail || r.Status == Skip {
			return 1
		}
	}
	return 0
}

// Print writes one line per check and its fix line under it.
func Print(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", strings.ToUpper(string(r.Status)), r.Name, r.Detail)
		if r.Fix != "" && r.Status != Pass {
			fmt.Fprintf(tw, "\t\tfix: %s\n", r.Fix)
		}
	}
	return tw.Flush()
}

// PrintJSON writes the results as one JSON document.
func PrintJSON(w io.Writer, results []Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(map[string]any{"checks": results, "ok": ExitCode(results) == 0})
}
