// Package fault is sandkeep's one typed user-facing error: a stable Code, a sentence a person can act on,
// and a Hint that says how to fix it. Every failure code is a constant here; the CLI maps any *Error to
// exit 125, the API (later) to an HTTP status.
package fault

import (
	"errors"
	"fmt"
)

// Code is a stable, machine-readable failure code. Never change the spelling of an existing code.
type Code string

// Failure codes. Keep sorted; each one appears in docs/ERRORS.md.
const (
	AgentMissing      Code = "AGENT_MISSING"      // the sandkeep-agent binary could not be found or read
	AgentProtocol     Code = "AGENT_PROTOCOL"     // the agent's report was garbage, forged or cut off
	CallerFailed      Code = "CALLER_FAILED"      // a run its caller finished as failed (POST /v1/runs/{id}/finish)
	DriverUnavailable Code = "DRIVER_UNAVAILABLE" // the container engine could not be reached
	ForeignContainer  Code = "FOREIGN_CONTAINER"  // a container has our name but is not ours
	ImageUnavailable  Code = "IMAGE_UNAVAILABLE"  // the image is not present and could not be pulled
	InvalidArgument   Code = "INVALID_ARGUMENT"   // a request field is malformed
	InvalidEnv        Code = "INVALID_ENV"        // an environment variable name or value is refused
	InvalidIdentity   Code = "INVALID_IDENTITY"   // tenant or user is empty, too long or has control characters
	InvalidMount      Code = "INVALID_MOUNT"      // a mount is malformed or denied by the guard
	InvalidTimeout    Code = "INVALID_TIMEOUT"    // a timeout outside 1s..24h
	InvalidWorkdir    Code = "INVALID_WORKDIR"    // a workdir that does not resolve under /workspace
	Internal          Code = "INTERNAL"           // a bug in sandkeep; please report it
	NotFound          Code = "SANDBOX_NOT_FOUND"  // no sandbox exists for that tenant and user
	PostureRefused    Code = "POSTURE_REFUSED"    // the configured posture is not allowed (e.g. root)
	SandboxBusy       Code = "SANDBOX_BUSY"       // the key's gate was not free within the wait bound
	KeyLimit          Code = "KEY_LIMIT"          // this process already runs or queues commands for its limit of keys
	SandboxFailed     Code = "SANDBOX_FAILED"     // the engine failed to create, start or run the sandbox

	TransportUnavailable Code = "TRANSPORT_UNAVAILABLE"  // --transport agent, but the agent channel is not up
	SpecInvalid          Code = "SPEC_INVALID"           // the spec or devcontainer.json has errors (diagnostics listed)
	SpecUnsupported      Code = "SPEC_UNSUPPORTED"       // the spec asks for something this build cannot apply yet
	StoreUnavailable     Code = "STORE_UNAVAILABLE"      // the run store (SQLite file or PostgreSQL) cannot be opened
	PreflightFailed      Code = "PREFLIGHT_FAILED"       // SANDKEEP_PREFLIGHT=1 and a doctor check failed
	PostCreateFailed     Code = "POST_CREATE_FAILED"     // the spec's post_create failed in a new sandbox (which was removed)
	BuildContextInvalid  Code = "BUILD_CONTEXT_INVALID"  // a build's Dockerfile or context cannot be sent (escapes, special files, limits)
	BuildFailed          Code = "BUILD_FAILED"           // the engine ran the image build and it failed
	SecretDeliveryFailed Code = "SECRET_DELIVERY_FAILED" // a secret file could not be placed in the sandbox; the command did not run
	SecretUnavailable    Code = "SECRET_UNAVAILABLE"     // a secret's source (an environment variable, a host file) is missing or refused
	SecretsNeedSandbox   Code = "SECRETS_NEED_SANDBOX"   // mode none with secret files: the host passthrough cannot deliver them

	// Egress (internal/egress, wired by lifecycle).
	EgressUnavailable Code = "EGRESS_UNAVAILABLE" // the sandbox's egress proxy cannot be served by this process
	NetworkInvalid    Code = "NETWORK_INVALID"    // a network block (mode, preset, rules, credentials) is refused
	// NetworkUnenforced: the driver cannot confine the sandbox's network to the proxy (a cluster whose network
	// plugin does not enforce NetworkPolicy), so a command with a network block is refused, never run open.
	NetworkUnenforced Code = "NETWORK_UNENFORCED"

	// Files in a sandbox's workspace (internal/files).
	FileNotFound  Code = "FILE_NOT_FOUND" // no such file or directory under /workspace
	FileTooLarge  Code = "FILE_TOO_LARGE" // an upload or download passed its configured size bound
	FileType      Code = "FILE_TYPE"      // a special file, or a directory where a file is needed (or the reverse)
	InvalidPath   Code = "INVALID_PATH"   // a path that escapes /workspace, or is malformed
	PathConflict  Code = "PATH_CONFLICT"  // a path exists with another type, or a parent is not a directory
	WorkspaceFull Code = "WORKSPACE_FULL" // the host's disk (or quota) under the workspace is full

	// Service (internal/api, tokens in the store).
	Unauthenticated Code = "UNAUTHENTICATED"   // no token, an unknown, revoked or expired one
	Forbidden       Code = "FORBIDDEN"         // the token lacks the scope the route needs
	RateLimited     Code = "RATE_LIMITED"      // a tenant limit (sandboxes, concurrent execs, request rate) was reached
	RequestInvalid  Code = "REQUEST_INVALID"   // malformed JSON, an unknown field, a bad parameter
	RequestTooLarge Code = "REQUEST_TOO_LARGE" // a request body or header past its bound
	RunNotFound     Code = "RUN_NOT_FOUND"     // no run with that id for this tenant
	UploadTooSlow   Code = "UPLOAD_TOO_SLOW"   // an upload's body arrived slower than the server's minimum rate
	ShuttingDown    Code = "SHUTTING_DOWN"     // the server is draining; retry on another instance or after restart

	// Policy: degrade or refuse (internal/policy).
	SandboxCapacity          Code = "SANDBOX_CAPACITY"           // the engine refused a sandbox for lack of capacity; retry may help
	SandboxDriverUnavailable Code = "SANDBOX_DRIVER_UNAVAILABLE" // no usable sandboxing driver, and the mode may not run on the host
	SandboxSetupTimeout      Code = "SANDBOX_SETUP_TIMEOUT"      // pulling, building or starting the sandbox passed its bound
	UntrustedWithoutSandbox  Code = "UNTRUSTED_WITHOUT_SANDBOX"  // an untrusted run would have run on the host

	// Port forwarding (lifecycle, driver.PortDialer).
	PortUnreachable        Code = "PORT_UNREACHABLE"         // nothing in the sandbox accepts connections on that port
	PortForwardUnavailable Code = "PORT_FORWARD_UNAVAILABLE" // the sandbox's driver cannot forward ports
	LocalPortInUse         Code = "LOCAL_PORT_IN_USE"        // port-forward's local port is taken on this host; nothing was forwarded
	// FilesUnavailable: the file API reads and writes the workspace on the host, and this driver keeps it
	// elsewhere (a Kubernetes claim).
	FilesUnavailable  Code = "FILES_UNAVAILABLE"
	SandboxNotRunning Code = "SANDBOX_NOT_RUNNING" // the sandbox exists but is stopped (a forward needs a running one)
	// Fork and snapshots (issue 23).
	SandboxExists    Code = "SANDBOX_EXISTS"     // a fork or restore named a key that already has a sandbox or a workspace
	QuotaExceeded    Code = "QUOTA_EXCEEDED"     // a fork or snapshot would pass its tenant's quota; nothing was made
	SnapshotNotFound Code = "SNAPSHOT_NOT_FOUND" // no snapshot of that name for this tenant
	SnapshotExists   Code = "SNAPSHOT_EXISTS"    // a snapshot create named one the tenant already has

	// Trust tiers (internal/tier, admission).
	TierRefused      Code = "TIER_REFUSED"       // a tier asked for what only a higher one may set (diagnostics name the tier and field)
	TemplateNotFound Code = "TEMPLATE_NOT_FOUND" // no operator template of that name for this tenant (missing and not allowed look alike)
	NetworkWidened   Code = "NETWORK_WIDENED"    // a caller's network block asks for more than its template allows

	// devcontainer features and compose files (internal/devcontainer/feature, internal/compose).
	FeatureInvalid     Code = "FEATURE_INVALID"     // a feature's reference, options or devcontainer-feature.json cannot be used
	FeatureUnavailable Code = "FEATURE_UNAVAILABLE" // an OCI feature could not be fetched from its registry (unreachable, missing, refused)
	ComposeInvalid     Code = "COMPOSE_INVALID"     // a compose file, or a service in it, asks for what sandkeep does not run
	CompanionFailed    Code = "COMPANION_FAILED"    // a compose companion service could not be created, started or became unhealthy
	// Processes: commands that outlive their call (sandkeep exec --detach, the process routes).
	ProcessNotFound    Code = "PROCESS_NOT_FOUND"   // no process with that pid or tag in the sandbox
	ProcessExited      Code = "PROCESS_EXITED"      // the process has ended: it takes no input, signal or resize
	ProcessUnavailable Code = "PROCESS_UNAVAILABLE" // processes need the agent channel of a long-lived sandkeep (serve, the daemon)

	// The local daemon (sandkeep daemon, SANDKEEP_DAEMON).
	DaemonUnavailable Code = "DAEMON_UNAVAILABLE" // SANDKEEP_DAEMON=on, but the home's daemon cannot be reached or started
	DaemonMismatch    Code = "DAEMON_MISMATCH"    // SANDKEEP_DAEMON=on, but the daemon runs with another operator environment
	DaemonLost        Code = "DAEMON_LOST"        // the daemon went away while it ran this call
	HomeOwned         Code = "HOME_OWNED"         // another daemon or server already owns this state home

	// A fleet of servers (issue 27).
	OwnerUnavailable Code = "OWNER_UNAVAILABLE" // another replica holds the key and cannot be reached; its lease has not expired yet
	OwnerLost        Code = "OWNER_LOST"        // the replica that owned the key went away while it ran this call
)

// Error is a user-facing failure. Err, when set, is the cause, reachable with errors.Is/As.
type Error struct {
	Code    Code
	Message string // one sentence: what happened
	Hint    string // what to do about it; may be empty
	Err     error
}

func (e *Error) Error() string {
	s := string(e.Code) + ": " + e.Message
	if e.Hint != "" {
		s += ": " + e.Hint
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// New returns an *Error with a formatted message.
func New(code Code, hint, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Hint: hint}
}

// Wrap returns an *Error that carries err as its cause.
func Wrap(err error, code Code, hint, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Hint: hint, Err: err}
}

// CodeOf returns the Code of the first *Error in err's chain, or "" when there is none.
func CodeOf(err error) Code {
	var fe *Error
	if errors.As(err, &fe) {
		return fe.Code
	}
	return ""
}

// Is reports whether err carries the given code.
func Is(err error, code Code) bool { return CodeOf(err) == code }
