// Package policy decides whether and how a command is isolated: which sandbox mode applies and which tier chose
// it (ResolveMode), what kind of host this is (HostKind), which driver provides sandboxes here (Selector), and
// whether a run goes into a sandbox, runs on the host, or is refused (Decide, SetupFailure). It is the one place
// these rules live; nothing below it re-decides them.
//
// Its functions are pure: the only I/O is the driver probes a caller hands to Selector.Select. The tier that
// chose a mode (Source) is carried along to label events and messages, and no decision ever depends on it.
package policy

import (
	"fmt"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// DefaultMode is the built-in default, used when no tier states a mode.
const DefaultMode = spec.ModeAuto

// EnvSandboxDefault names the environment variable that sets the machine's default mode.
const EnvSandboxDefault = "SANDKEEP_SANDBOX_DEFAULT"

// Source is the tier that chose a mode. It labels events and messages; behaviour never depends on it.
type Source string

// Sources, from the highest precedence to the lowest.
const (
	SourceCLI     Source = "cli"     // --sandbox
	SourceSpec    Source = "spec"    // sandbox.mode in the spec (or the spec's image or build, see ResolveMode)
	SourceEnv     Source = "env"     // SANDKEEP_SANDBOX_DEFAULT
	SourceDefault Source = "default" // DefaultMode
)

// Describe names the tier the way a person configures it, for messages.
func (s Source) Describe() string {
	switch s {
	case SourceCLI:
		return "--sandbox"
	case SourceSpec:
		return "the spec's sandbox block"
	case SourceEnv:
		return EnvSandboxDefault
	case SourceDefault:
		return "the built-in default"
	}
	return fmt.Sprintf("source %q", string(s))
}

// ModeInputs are everything the mode depends on. Each mode is one of spec.ModeInherit (""), spec.ModeNone,
// spec.ModeAuto or spec.ModeInline, spelled exactly (no case folding, no trimming).
type ModeInputs struct {
	CLI  string // the --sandbox flag; "" when not given
	Spec string // sandbox.mode from the spec; "" when there is no spec or it leaves the mode unset
	// SpecNamesImage reports whether the spec names an image or a build (a more specific statement of the
	// intent to sandbox than --sandbox auto).
	SpecNamesImage bool
	Env            string // the value of SANDKEEP_SANDBOX_DEFAULT; "" when unset or empty
}

// Resolution is the mode that applies, the tier that chose it, and a sentence saying how.
type Resolution struct {
	Mode   string // spec.ModeNone, spec.ModeAuto or spec.ModeInline; never ""
	Source Source
	Note   string // for doctor and verbose output; never a warning (an explicit none is silent by design)
}

// InvalidModeError is a mode value that is not "", none, auto or inline. ResolveMode returns it inside a
// *fault.Error with code INVALID_ARGUMENT.
type InvalidModeError struct {
	Source Source // the tier the value came from
	Value  string
}

func (e *InvalidModeError) Error() string {
	return fmt.Sprintf("invalid mode %q from %s: want \"\", none, auto or inline", e.Value, e.Source.Describe())
}

// ResolveMode returns the mode that applies, by these rules:
//
//   - Precedence: --sandbox > the spec's sandbox.mode > SANDKEEP_SANDBOX_DEFAULT > DefaultMode (auto). An empty
//     value inherits: that tier is skipped.
//   - --sandbox auto yields to a spec that names an image or a build, the more specific statement of the same
//     intent: the spec's tier decides, with the spec's mode when it states an active one (inline beats --sandbox
//     auto) and auto when it leaves the mode unset. A spec whose mode is none states the opposite intent, so
//     it does not take part: --sandbox auto stands.
//   - --sandbox none wins over everything, and so does --sandbox inline; neither yields.
//   - An explicit none, from any tier, is silent: the Note explains, nothing warns.
//   - The spec is the repository tier: it may raise isolation over SANDKEEP_SANDBOX_DEFAULT (auto -> inline),
//     never lower it; a weaker spec mode yields to the operator's default (source env). (A repository's none is
//     refused before this, by internal/tier.)
//
// Every input is checked, including those a higher tier overrides: a value that is not understood is an error
// (fail closed), an *fault.Error with code INVALID_ARGUMENT wrapping an *InvalidModeError for the first bad
// tier in precedence order.
func ResolveMode(in ModeInputs) (Resolution, error) {
	for _, t := range []struct {
		src Source
		val string
	}{{SourceCLI, in.CLI}, {SourceSpec, in.Spec}, {SourceEnv, in.Env}} {
		if !validMode(t.val) {
			return Resolution{}, fault.Wrap(&InvalidModeError{Source: t.src, Value: t.val}, fault.InvalidArgument,
				modeHint(t.src), "invalid mode %q from %s: want \"\", none, auto or inline", t.val, t.src.Describe())
		}
	}
	switch {
	case in.CLI == spec.ModeAuto && in.SpecNamesImage && in.Spec != spec.ModeNone:
		mode := in.Spec
		if mode == spec.ModeInherit {
			mode = spec.ModeAuto
		}
		return Resolution{Mode: mode, Source: SourceSpec,
			Note: fmt.Sprintf("mode %s from the spec: --sandbox auto yields to a spec that names an image or a build", mode)}, nil
	case in.CLI != spec.ModeInherit:
		return resolved(in.CLI, SourceCLI), nil
	case in.Spec != spec.ModeInherit && in.Env != spec.ModeInherit && strength(in.Env) > strength(in.Spec):
		// A repository may raise isolation, never lower it: the operator's stricter default stands.
		r := resolved(in.Env, SourceEnv)
		r.Note += fmt.Sprintf(" (the spec's %s is weaker and may not lower it)", in.Spec)
		return r, nil
	case in.Spec != spec.ModeInherit:
		return resolved(in.Spec, SourceSpec), nil
	case in.Env != spec.ModeInherit:
		return resolved(in.Env, SourceEnv), nil
	}
	return resolved(DefaultMode, SourceDefault), nil
}

func resolved(mode string, src Source) Resolution {
	return Resolution{Mode: mode, Source: src, Note: fmt.Sprintf("mode %s from %s", mode, src.Describe())}
}

func validMode(m string) bool {
	switch m {
	case spec.ModeInherit, spec.ModeNone, spec.ModeAuto, spec.ModeInline:
		return true
	}
	return false
}

// activeMode reports whether m asks for a sandbox.
// strength orders modes by how much isolation they demand: none < auto (and unset) < inline.
func strength(m string) int {
	switch m {
	case spec.ModeNone:
		return 0
	case spec.ModeInline:
		return 2
	}
	return 1
}

func activeMode(m string) bool { return m == spec.ModeAuto || m == spec.ModeInline }

func modeHint(src Source) string {
	switch src {
	case SourceCLI:
		return "pass --sandbox none, auto or inline, or leave it out"
	case SourceSpec:
		return "set sandbox.mode in the spec to none, auto or inline, or remove it"
	case SourceEnv:
		return "set " + EnvSandboxDefault + " to none, auto or inline, or unset it"
	}
	return ""
}
