package doctor

import (
	"fmt"
	"strings"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// Preflight is what SANDKEEP_PREFLIGHT asks: run the strict battery before each command (On), and treat a check
// that could not run as a failure too (Strict).
type Preflight struct {
	On, Strict bool
}

// ParsePreflight reads SANDKEEP_PREFLIGHT: 1, true, yes or on (in any case) turn it on; strict also refuses on a
// check that could not run; "", 0, false, no and off leave it off. Anything else is INVALID_ARGUMENT: a value
// that was meant to turn the preflight on never disables it silently.
func ParsePreflight(v string) (Preflight, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return Preflight{On: true}, nil
	case "strict":
		return Preflight{On: true, Strict: true}, nil
	case "", "0", "false", "no", "off":
		return Preflight{}, nil
	}
	return Preflight{}, fault.New(fault.InvalidArgument, "set SANDKEEP_PREFLIGHT to 1, true, yes, on or strict (or 0/off)",
		"SANDKEEP_PREFLIGHT=%q is not a value sandkeep understands", cut(v))
}

// Verdict splits a preflight's results: failures refuse the command, warnings are printed and let it run. A
// check that could not run (Skip) is a warning, and with strict a failure.
func (p Preflight) Verdict(results []Result) (failed, warnings []Result) {
	for _, r := range results {
		switch {
		case r.Status == Fail, r.Status == Skip && p.Strict:
			failed = append(failed, r)
		case r.Status == Warn, r.Status == Skip:
			warnings = append(warnings, r)
		}
	}
	return failed, warnings
}

// Line is one result as a preflight prints it: "WARN name: detail".
func (r Result) Line() string {
	return fmt.Sprintf("%s %s: %s", strings.ToUpper(string(r.Status)), r.Name, r.Detail)
}

// cut bounds a value echoed back in an error.
func cut(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
