package policy

import (
	"context"
	"errors"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// Outcome is how a run that failed with a code is recorded: its final status and whether a retry may help.
type Outcome struct {
	Status      RunStatus
	Disposition Disposition
}

var (
	input     = Outcome{StatusFailed, Deterministic}           // what the input decides: retrying the same run fails the same way
	transient = Outcome{StatusFailed, Infrastructure}          // the machine, the engine or a peer was in the way
	resumable = Outcome{StatusFailedResumable, Infrastructure} // setup could not finish now; the same run may resume later
)

// outcomes is the one table from failure code to how a run that failed with it is recorded. Every code of
// internal/fault has a row (TestOutcomeEveryCode): a consumer that redelivers infrastructure failures must never
// retry what the input decided.
var outcomes = map[fault.Code]Outcome{
	// Setup that could not finish now: the run may be resumed.
	fault.SandboxSetupTimeout: resumable,
	fault.SandboxCapacity:     resumable,

	// The machine, the engine, the store or a peer was in the way; a retry may succeed.
	fault.DriverUnavailable:    transient,
	fault.SandboxFailed:        transient,
	fault.AgentProtocol:        transient,
	fault.SandboxBusy:          transient,
	fault.KeyLimit:             transient,
	fault.StoreUnavailable:     transient,
	fault.EgressUnavailable:    transient,
	fault.TransportUnavailable: transient,
	fault.SecretDeliveryFailed: transient,
	fault.FeatureUnavailable:   transient,
	fault.CompanionFailed:      transient,
	fault.RateLimited:          transient,
	fault.ShuttingDown:         transient,
	fault.UploadTooSlow:        transient,
	fault.WorkspaceFull:        transient,
	fault.PortUnreachable:      transient,
	fault.SandboxNotRunning:    transient,
	fault.DaemonUnavailable:    transient,
	fault.DaemonLost:           transient,
	fault.OwnerUnavailable:     transient,
	fault.OwnerLost:            transient,
	fault.HomeOwned:            transient,
	fault.Internal:             transient,

	// What the input (the request, the spec, the template, the operator's configuration) decides.
	fault.AgentMissing:             input,
	fault.ForeignContainer:         input,
	fault.ImageUnavailable:         input,
	fault.InvalidArgument:          input,
	fault.InvalidEnv:               input,
	fault.InvalidIdentity:          input,
	fault.InvalidMount:             input,
	fault.InvalidTimeout:           input,
	fault.InvalidWorkdir:           input,
	fault.InvalidPath:              input,
	fault.NotFound:                 input,
	fault.PostureRefused:           input,
	fault.SpecInvalid:              input,
	fault.SpecUnsupported:          input,
	fault.PreflightFailed:          input,
	fault.PostCreateFailed:         input,
	fault.BuildContextInvalid:      input,
	fault.BuildFailed:              input,
	fault.SecretUnavailable:        input,
	fault.SecretsNeedSandbox:       input,
	fault.NetworkInvalid:           input,
	fault.NetworkUnenforced:        input,
	fault.NetworkWidened:           input,
	fault.FileNotFound:             input,
	fault.FileTooLarge:             input,
	fault.FileType:                 input,
	fault.PathConflict:             input,
	fault.Unauthenticated:          input,
	fault.Forbidden:                input,
	fault.RequestInvalid:           input,
	fault.RequestTooLarge:          input,
	fault.RunNotFound:              input,
	fault.SandboxDriverUnavailable: input,
	fault.UntrustedWithoutSandbox:  input,
	fault.PortForwardUnavailable:   input,
	fault.LocalPortInUse:           input,
	fault.FilesUnavailable:         input,
	fault.TierRefused:              input,
	fault.TemplateNotFound:         input,
	fault.CallerFailed:             input, // the caller finished its run as failed: the caller's verdict, not sandkeep's to retry
	fault.FeatureInvalid:           input,
	fault.ComposeInvalid:           input,
	fault.DaemonMismatch:           input,
	fault.SandboxExists:            input, // a fork or restore into a key that has one: the caller's to change
	fault.QuotaExceeded:            input,
	fault.SnapshotNotFound:         input,
	fault.SnapshotExists:           input,
	fault.ProcessNotFound:          input,
	fault.ProcessExited:            input,
	fault.ProcessUnavailable:       input, // the transport decides it (exec, runsc, kube): a retry meets the same
}

// OutcomeOf is how a run that failed with code is recorded; a code without a row (a bug: the table's test
// catches it) is treated as infrastructure, which a consumer may retry.
func OutcomeOf(code fault.Code) Outcome {
	if o, ok := outcomes[code]; ok {
		return o
	}
	return transient
}

// Failure is how a run that failed is recorded.
type Failure struct {
	Err         *fault.Error // the user-facing error, wrapping the cause
	Status      RunStatus
	Disposition Disposition
}

// SetupFailure classifies a run's failure by the one table (OutcomeOf), after giving a code to what has none:
//
//   - a context deadline (the setup bound) anywhere in its chain is SANDBOX_SETUP_TIMEOUT;
//   - a capacity refusal (errdefs.ErrResourceExhausted) is SANDBOX_CAPACITY;
//   - anything else without a code is SANDBOX_FAILED.
//
// A cancellation by the caller keeps its code but is never deterministic nor resumable: failed, infrastructure
// (the caller went away; nothing was decided). It returns a zero Failure for a nil err.
func SetupFailure(err error) Failure {
	if err == nil {
		return Failure{}
	}
	var fe *fault.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		fe = fault.Wrap(err, fault.SandboxSetupTimeout, "retry; if it keeps happening, pull or build the image ahead of time",
			"sandbox setup (image pull, build or start) did not finish within its bound")
	case errdefs.IsResourceExhausted(err) && !fault.Is(err, fault.SandboxCapacity):
		fe = fault.Wrap(err, fault.SandboxCapacity, "retry later, or free capacity on the engine",
			"the engine has no capacity for another sandbox")
	case errors.As(err, &fe):
	default:
		fe = fault.Wrap(err, fault.SandboxFailed, "", "sandbox setup failed: %s", oneLine(err.Error()))
	}
	o := OutcomeOf(fe.Code)
	if errors.Is(err, context.Canceled) {
		o = transient
	}
	return Failure{Err: fe, Status: o.Status, Disposition: o.Disposition}
}
