package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// Trust says whether a run's commands may run outside a sandbox.
type Trust string

// Trust levels. Anything other than Trusted (the zero value included) is treated as untrusted: fail closed.
const (
	Trusted   Trust = "trusted"
	Untrusted Trust = "untrusted"
)

// ParseTrust reads a --trust value: trusted or untrusted, spelled exactly.
func ParseTrust(s string) (Trust, error) {
	switch t := Trust(s); t {
	case Trusted, Untrusted:
		return t, nil
	}
	return "", fault.New(fault.InvalidArgument, "pass --trust trusted or --trust untrusted", "invalid trust %q", s)
}

// Action is what happens to a run.
type Action string

// Actions.
const (
	RunSandboxed Action = "run_sandboxed" // in a sandbox of Decision.Driver
	RunOnHost    Action = "run_on_host"   // through the host passthrough: no isolation at all
	Refuse       Action = "refuse"        // nothing runs; Decision.Err says why
)

// Disposition says whether retrying a failed run may help.
type Disposition string

// Dispositions.
const (
	Deterministic  Disposition = "deterministic"  // the same run fails the same way until someone changes something
	Infrastructure Disposition = "infrastructure" // the machine or engine was in the way; a retry may succeed
)

// RunStatus is the final status a policy failure gives a run.
type RunStatus string

// Run statuses set by this package.
const (
	StatusFailed          RunStatus = "failed"
	StatusFailedResumable RunStatus = "failed_resumable"
)

// DecideInputs are what Decide weighs.
type DecideInputs struct {
	Mode  Resolution // from ResolveMode
	Trust Trust
	// Selected and Obstacle are Selector.Select's results. For mode none they are ignored (and Select need not
	// be called).
	Selected Selection
	Obstacle error
	// SpecHasSecretFiles: the spec or the template lists secret files, which the host passthrough cannot deliver.
	SpecHasSecretFiles bool
}

// Decision is what to do with a run.
type Decision struct {
	Action Action
	Driver string // the driver to run with: the selected one, or DriverHost for RunOnHost; "" for Refuse
	// Event is the sandbox_skipped payload to record (events.NameSandboxSkipped), nil when there is none (a
	// sandboxed run, or mode none). It never holds secrets: only whether secret files were dropped.
	Event *events.SandboxSkipped
	// FileSecretsDropped: the run goes to the host and the spec's secret files will not be delivered.
	FileSecretsDropped bool
	// Err is the refusal (a *fault.Error), nil unless Action is Refuse; FailureCode is its code, Status and
	// Disposition what the run record gets.
	Err         error
	FailureCode fault.Code
	Status      RunStatus
	Disposition Disposition
	// CLILine is the one loud line the CLI prints on stderr when an active mode degrades to the host; "" when
	// nothing must be printed. It is a single line without a newline.
	CLILine string
}

// Decide is the one place where degrade-or-refuse lives:
//
//   - none: runs on the host, silently (no event, no line); untrusted: refused with UNTRUSTED_WITHOUT_SANDBOX;
//     with secret files (the spec's or the template's): refused with SECRETS_NEED_SANDBOX, since the host
//     cannot deliver them and an explicit none never drops anything silently.
//   - an obstacle other than *NoSandboxError (e.g. --driver naming an unavailable driver): refused with its
//     code (SANDBOX_DRIVER_UNAVAILABLE when it has none), deterministic (infrastructure for a context that
//     ended).
//   - auto or inline with a sandboxing driver: runs sandboxed.
//   - inline without one: refused with SANDBOX_DRIVER_UNAVAILABLE, event refused, deterministic.
//   - auto without one, untrusted: refused with UNTRUSTED_WITHOUT_SANDBOX, naming the tier that chose the mode.
//   - auto without one, when the host passthrough is not usable either: refused with SANDBOX_DRIVER_UNAVAILABLE.
//   - auto without one: runs on the host with a sandbox_skipped event (file_secrets_dropped when the spec has
//     secret files) and a loud CLI line.
//
// Every refusal has status failed; those of an active mode also carry a sandbox_skipped event with refused
// set. Decide reads Mode.Source only to label the event and the messages.
func Decide(in DecideInputs) Decision {
	mode, src := in.Mode.Mode, in.Mode.Source
	untrusted := in.Trust != Trusted
	if !validMode(mode) || mode == spec.ModeInherit {
		return refuse(in, fault.New(fault.Internal, "resolve the mode with policy.ResolveMode",
			"mode %q is not a resolved mode", mode), Deterministic)
	}

	if mode == spec.ModeNone {
		if untrusted {
			return refuse(in, untrustedError(in.Mode), Deterministic)
		}
		if in.SpecHasSecretFiles {
			return refuse(in, fault.New(fault.SecretsNeedSandbox,
				"run it in a sandbox (--sandbox auto or inline), or remove the secret files from the spec or template",
				"mode none (from %s) runs on the host, which cannot deliver secret files", src.Describe()), Deterministic)
		}
		return Decision{Action: RunOnHost, Driver: DriverHost}
	}

	var noSandbox *NoSandboxError
	if in.Obstacle != nil && !errors.As(in.Obstacle, &noSandbox) {
		return refuse(in, hardObstacle(in.Obstacle), dispositionOf(in.Obstacle))
	}
	if in.Selected.Sandboxing && in.Selected.Driver != "" && in.Obstacle == nil {
		return Decision{Action: RunSandboxed, Driver: in.Selected.Driver}
	}

	obstacle := describeObstacle(in.Obstacle)
	switch {
	case mode == spec.ModeInline:
		return refuse(in, fault.Wrap(in.Obstacle, fault.SandboxDriverUnavailable,
			"start a container engine (e.g. the Docker daemon), or use --sandbox auto to allow running on the host",
			"mode inline (from %s) needs a sandbox, and %s", src.Describe(), obstacle), Deterministic)
	case untrusted:
		return refuse(in, untrustedError(in.Mode), Deterministic)
	case in.Selected.Driver != DriverHost:
		return refuse(in, fault.Wrap(in.Obstacle, fault.SandboxDriverUnavailable,
			"start a container engine (e.g. the Docker daemon), or install the sandkeep-agent for the host passthrough",
			"mode auto (from %s) found no sandboxing driver and cannot run on the host either: %s", src.Describe(), obstacle),
			Deterministic)
	}

	line := fmt.Sprintf("sandkeep: WARNING: running UNSANDBOXED on the host: mode auto (from %s), %s", src.Describe(), obstacle)
	if in.SpecHasSecretFiles {
		line += "; the spec's secret files are NOT delivered"
	}
	line += "; use --sandbox inline to refuse instead"
	return Decision{
		Action: RunOnHost,
		Driver: DriverHost,
		Event: &events.SandboxSkipped{Mode: mode, Source: string(src), Obstacle: obstacle,
			FileSecretsDropped: in.SpecHasSecretFiles},
		FileSecretsDropped: in.SpecHasSecretFiles,
		CLILine:            line,
	}
}

// refuse builds a refusal of in with err (a *fault.Error). An active mode that found no usable sandbox records
// sandbox_skipped with refused set; other refusals (mode none, a mode that is not resolved) have only the run
// record.
func refuse(in DecideInputs, err *fault.Error, disp Disposition) Decision {
	d := Decision{Action: Refuse, Err: err, FailureCode: err.Code, Status: StatusFailed, Disposition: disp}
	if activeMode(in.Mode.Mode) {
		d.Event = &events.SandboxSkipped{Mode: in.Mode.Mode, Source: string(in.Mode.Source), Obstacle: oneLine(err.Message),
			Refused: true}
	}
	return d
}

func untrustedError(res Resolution) *fault.Error {
	return fault.New(fault.UntrustedWithoutSandbox,
		"make a sandboxing driver available and use --sandbox inline (or auto), or run it as trusted",
		"an untrusted run may not run without a sandbox, and mode %s, chosen by %s (source %s), would run it on the host",
		res.Mode, res.Source.Describe(), res.Source)
}

// hardObstacle is the refusal for an obstacle that may not degrade: the *fault.Error Select built (it has the
// probe's reason and a hint), or a SANDBOX_DRIVER_UNAVAILABLE wrapping anything else.
func hardObstacle(err error) *fault.Error {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return fe
	}
	return fault.Wrap(err, fault.SandboxDriverUnavailable, "run `sandkeep doctor` to see which drivers are usable",
		"no driver could be selected: %s", oneLine(err.Error()))
}

// dispositionOf: a caller's context that ended is not the machine's fault nor a lasting one.
func dispositionOf(err error) Disposition {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return Infrastructure
	}
	return Deterministic
}

func describeObstacle(err error) string {
	if err == nil {
		return "no sandboxing driver was selected"
	}
	return oneLine(err.Error())
}

// maxObstacle bounds the obstacle text in events and the CLI line.
const maxObstacle = 512

// oneLine makes s fit on one line: control characters become spaces and the length is bounded.
func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if len(s) > maxObstacle {
		cut := maxObstacle
		for cut > 0 && !isRuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return s
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
