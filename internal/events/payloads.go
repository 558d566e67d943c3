package events

import "unicode/utf8"

// This file holds one payload type per event name. Field names are snake_case on the wire; a field that is
// added later must be optional (omitempty or meaningful as its zero value) so old events still decode.

// SandboxSkipped (sandbox_skipped): an active mode found no usable driver. With mode auto the command ran on the
// host anyway; with mode inline it was refused (Refused). FileSecretsDropped says the spec had secret files that
// the host passthrough did not deliver.
type SandboxSkipped struct {
	Mode               string `json:"mode"`
	Source             string `json:"source"`
	Obstacle           string `json:"obstacle"`
	FileSecretsDropped bool   `json:"file_secrets_dropped"`
	Refused            bool   `json:"refused,omitempty"`
}

// SandboxStarted (sandbox_started): a sandbox was created, or a stopped one started, and is ready for commands.
type SandboxStarted struct {
	Sandbox    string `json:"sandbox"` // container or pod name
	Driver     string `json:"driver"`
	Image      string `json:"image,omitempty"`
	Created    bool   `json:"created"` // false: an existing, stopped sandbox was started
	DurationMS int64  `json:"duration_ms"`
}

// SandboxAdopted (sandbox_adopted): a running sandbox left by an earlier process was taken over as is.
type SandboxAdopted struct {
	Sandbox string `json:"sandbox"`
	Driver  string `json:"driver"`
}

// SandboxClaimed (sandbox_claimed): a new key's first command took a member of its template's warm pool, already
// created, started and connected, instead of creating a sandbox.
type SandboxClaimed struct {
	Sandbox    string `json:"sandbox"`
	Driver     string `json:"driver"`
	Template   string `json:"template"`
	Member     string `json:"member"` // the member's name in the pool
	DurationMS int64  `json:"duration_ms"`
}

// SandboxForked (sandbox_forked): a new key's sandbox was made with a copy of another key's workspace (fork), in
// the new key's run. From names the source's sandbox; Files and Bytes are the regular files copied, Reflinked
// how many of them share their extents with the source's (copy-on-write) instead of being copied.
type SandboxForked struct {
	Sandbox    string `json:"sandbox"`
	From       string `json:"from"`
	Driver     string `json:"driver"`
	Template   string `json:"template,omitempty"`
	Files      int64  `json:"files"`
	Bytes      int64  `json:"bytes"`
	Reflinked  int64  `json:"reflinked"`
	DurationMS int64  `json:"duration_ms"`
}

// SnapshotCreated (snapshot_created): a key's workspace was archived as a snapshot of its tenant (no run).
// Digest names the archive (sha256:<hex>), shared by snapshots of the same content.
type SnapshotCreated struct {
	Snapshot   string `json:"snapshot"`
	Sandbox    string `json:"sandbox"`
	Digest     string `json:"digest"`
	Bytes      int64  `json:"bytes"`
	DurationMS int64  `json:"duration_ms"`
}

// SnapshotRestored (snapshot_restored): a new key's sandbox was made from a snapshot, in the new key's run.
type SnapshotRestored struct {
	Snapshot   string `json:"snapshot"`
	Sandbox    string `json:"sandbox"`
	Digest     string `json:"digest"`
	Bytes      int64  `json:"bytes"`
	DurationMS int64  `json:"duration_ms"`
}

// SnapshotDeleted (snapshot_deleted): a snapshot was removed (no run); ArchiveRemoved says whether its archive
// went too (no other snapshot shared it).
type SnapshotDeleted struct {
	Snapshot       string `json:"snapshot"`
	Digest         string `json:"digest"`
	ArchiveRemoved bool   `json:"archive_removed"`
}

// Recycle reasons, the values of SandboxRecycled.Reason.
const (
	RecycleImage       = "image"        // the image (or build result) changed
	RecyclePosture     = "posture"      // the security posture hash drifted
	RecycleState       = "state"        // the sandbox was in a state it cannot be started from
	RecycleExecFailure = "exec_failure" // the sandbox could no longer run commands
)

// SandboxRecycled (sandbox_recycled): a sandbox was removed to be recreated, for Reason (Recycle*).
type SandboxRecycled struct {
	Reason  string `json:"reason"`
	Sandbox string `json:"sandbox"`
}

// SandboxStoppedIdle (sandbox_stopped_idle): the sweeper stopped a sandbox that had been idle for IdleMS.
type SandboxStoppedIdle struct {
	Sandbox string `json:"sandbox"`
	IdleMS  int64  `json:"idle_ms"`
}

// SandboxSuspended (sandbox_suspended): an idle sandbox of a template with suspend_after (Reason "idle"), or one
// past retention of a template with pause_on_retention (Reason "retention"), was removed (its container or pod,
// and on kubernetes its record) with its workspace kept; the key's next command resumes it.
type SandboxSuspended struct {
	Sandbox  string `json:"sandbox"`
	Template string `json:"template"`
	IdleMS   int64  `json:"idle_ms"`
	Reason   string `json:"reason"`
}

// Reasons of sandbox_suspended.
const (
	SuspendIdle      = "idle"
	SuspendRetention = "retention"
)

// SandboxResumed (sandbox_resumed): a suspended key's sandbox was made again over its kept workspace for a
// command; DurationMS is what the resume added to that first command, SuspendedMS how long it was suspended.
type SandboxResumed struct {
	Sandbox     string `json:"sandbox"`
	Driver      string `json:"driver"`
	Template    string `json:"template,omitempty"`
	SuspendedMS int64  `json:"suspended_ms"`
	DurationMS  int64  `json:"duration_ms"`
}

// SandboxRemoved (sandbox_removed): a sandbox and its resources were removed; Reason says why (e.g. retention,
// request, recycle).
type SandboxRemoved struct {
	Sandbox string `json:"sandbox"`
	Reason  string `json:"reason,omitempty"`
}

// SandboxBuildStarted (sandbox_build_started): an image build began. Paths are relative to the workspace. Build
// arguments are never recorded: they may carry secrets.
type SandboxBuildStarted struct {
	Dockerfile string `json:"dockerfile"`
	Context    string `json:"context"`
}

// SandboxBuildFinished (sandbox_build_finished): a build produced Image.
type SandboxBuildFinished struct {
	Image      string `json:"image"`
	DurationMS int64  `json:"duration_ms"`
}

// SandboxFeatures (sandbox_features_installed): the devcontainer's features were installed into Image (a
// derived image, reused when the same base, features and options were built before). Options are never
// recorded: a feature's option may carry a token. Dropped lists what the features' metadata asked for that was
// not done (privileged, capAdd, a refused mount, ...), one "feature field: why" line each.
type SandboxFeatures struct {
	Image      string    `json:"image"`
	Features   []Feature `json:"features"`
	Dropped    []string  `json:"dropped,omitempty"`
	DurationMS int64     `json:"duration_ms"`
}

// Feature is one installed devcontainer feature: its name as devcontainer.json gives it, its metadata's
// version and the digest of what was installed (an OCI manifest's, or the local files').
type Feature struct {
	ID      string `json:"id"`
	Version string `json:"version"`
	Digest  string `json:"digest"`
}

// SandboxBuildFailed (sandbox_build_failed): a build failed. Error is sandkeep's own error sentence, never the
// build's output.
type SandboxBuildFailed struct {
	Error      string `json:"error"`
	DurationMS int64  `json:"duration_ms"`
}

// SandboxEnvDenied (sandbox_env_denied): environment variables of the deny class were stripped. Keys holds
// their names only, never their values; Origin says where they came from (e.g. devcontainer.json).
type SandboxEnvDenied struct {
	Keys   []string `json:"keys"`
	Origin string   `json:"origin"`
}

// DevcontainerDropped (sandbox_devcontainer_dropped): the repository's devcontainer.json asked for things that
// would weaken the sandbox's posture (privileged, a capability, a host namespace, seccomp off, a device, a
// runtime socket or sensitive host path, initializeCommand ...); they were dropped, not obeyed, and the sandbox
// runs hardened without them. One event per run lists every item with why. Origin is the file's base name.
type DevcontainerDropped struct {
	Origin string             `json:"origin"`
	Items  []DevcontainerItem `json:"items"`
}

// DevcontainerItem is one dropped item: the field it was written in, what it asked (as written: a flag with
// its value, a mount string, a capability; never an environment value), why it was dropped, and its line.
type DevcontainerItem struct {
	Field string `json:"field"`
	Item  string `json:"item,omitempty"`
	Why   string `json:"why"`
	Line  int    `json:"line,omitempty"`
}

// SandboxPostStart (sandbox_post_start): devcontainer.json's postStartCommand ran at a start of the sandbox.
// OutputTail is the last KiB of its output (the repository's own command; never an environment value).
type SandboxPostStart struct {
	ExitCode   int    `json:"exit_code"`
	TimedOut   bool   `json:"timed_out"`
	DurationMS int64  `json:"duration_ms"`
	OutputTail string `json:"output_tail,omitempty"`
}

// SandboxPostCreate (sandbox_post_create): the spec's post-create command ran once in a new sandbox. The command
// itself is not recorded.
type SandboxPostCreate struct {
	ExitCode   int   `json:"exit_code"`
	TimedOut   bool  `json:"timed_out"`
	DurationMS int64 `json:"duration_ms"`
}

// ExecStarted (exec_started): a command began. Command is argv[0] only (see the Command function): arguments,
// environment and stdin may hold secrets and are never recorded.
type ExecStarted struct {
	Sandbox   string `json:"sandbox,omitempty"` // empty when the command ran on the host
	Command   string `json:"command"`
	Workdir   string `json:"workdir,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
	Transport string `json:"transport,omitempty"` // agent, exec, host
	// GateWaitMS is how long the command waited for its key's gate (another command of the same user).
	GateWaitMS int64 `json:"gate_wait_ms"`
}

// ExecFinished (exec_finished): a command ended with ExitCode (or hit its deadline: TimedOut). Output is never
// recorded, only whether it was truncated.
type ExecFinished struct {
	ExitCode   int    `json:"exit_code"`
	TimedOut   bool   `json:"timed_out"`
	DurationMS int64  `json:"duration_ms"`
	Transport  string `json:"transport,omitempty"`
	Truncated  bool   `json:"truncated,omitempty"`
}

// NetworkBlocked (network_blocked): a sandbox's egress proxy refused a request. Hosts on the silent list are
// refused without one. A credential's value never appears here; Rule then names the credential.
type NetworkBlocked struct {
	Host    string `json:"host"`
	Port    int    `json:"port"`
	Rule    string `json:"rule,omitempty"`    // the rule (or credential name) that denied it; empty when no rule allowed it
	Reason  string `json:"reason,omitempty"`  // not-allowlisted, denied-by-rule, loopback, private, metadata, sni-mismatch, credential-leak, ...
	Addr    string `json:"addr,omitempty"`    // the resolved address refused, for an address class
	Sandbox string `json:"sandbox,omitempty"` // the sandbox's container name
	Key     string `json:"key,omitempty"`     // the sandbox's key, short form
}

// CredentialReflected (credential_reflected): a response from one of a credential's hosts carried the
// credential's value back towards the sandbox (in a form the egress proxy produced: literal, percent-encoded,
// base64, the Basic credential it wrote), and the proxy replaced it with the placeholder before the sandbox saw
// it. One per response, credential and place. Never the value.
type CredentialReflected struct {
	Credential string `json:"credential"` // the credential's name
	Host       string `json:"host"`
	Port       int    `json:"port"`
	Where      string `json:"where"`             // header or body
	Sandbox    string `json:"sandbox,omitempty"` // the sandbox's container name
	Key        string `json:"key,omitempty"`     // the sandbox's key, short form
}

// NetworkBlockedRepeats (network_blocked_repeats): at the end of a command, the refusals that were not recorded one
// by one. A command records the first network_blocked of each host, port, reason and rule (up to a cap per
// command); what repeats, and what came past the cap, is counted here, in one event, instead of one store write
// per refusal.
type NetworkBlockedRepeats struct {
	Repeats []BlockedCount `json:"repeats,omitempty"` // refusals of a kind already recorded, counted per kind
	Dropped int            `json:"dropped,omitempty"` // refusals of kinds past the cap, not recorded at all
	Sandbox string         `json:"sandbox,omitempty"`
	Key     string         `json:"key,omitempty"`
}

// BlockedCount is how many more times one kind of refusal happened after its network_blocked event.
type BlockedCount struct {
	Host   string `json:"host"`
	Port   int    `json:"port"`
	Reason string `json:"reason,omitempty"`
	Rule   string `json:"rule,omitempty"`
	Count  int    `json:"count"`
}

// maxCommand bounds ExecStarted.Command: argv[0] is usually a short program name, and an event is no place for
// a long one.
const maxCommand = 256

// Command returns what an exec event may say about argv: argv[0] alone, cut to 256 bytes. The remaining
// arguments are never recorded, because a command line is where secrets (tokens, passwords in URLs) end up.
func Command(argv []string) string {
	if len(argv) == 0 {
		return ""
	}
	c := argv[0]
	if len(c) > maxCommand {
		n := maxCommand
		for n > 0 && !utf8.RuneStart(c[n]) { // cut on a rune boundary
			n--
		}
		c = c[:n]
	}
	return c
}

// PortForwardOpened (port_forward_opened): a forwarded connection reached 127.0.0.1:Port inside the sandbox.
// Via says who opened it: "cli" (sandkeep port-forward) or "api" (the server's route), and Conn numbers the
// connection so that its port_forward_closed can be matched.
type PortForwardOpened struct {
	Sandbox string `json:"sandbox"`
	Port    int    `json:"port"`
	Conn    uint64 `json:"conn"`
	Via     string `json:"via,omitempty"`
	// Transport is how the connection reaches the sandbox: "agent" (a stream on the agent's channel) or "exec"
	// (one engine exec of the agent, the fallback where this process has no channel to the sandbox).
	Transport string `json:"transport,omitempty"`
}

// PortForwardClosed (port_forward_closed): a forwarded connection ended; the byte counts are what went to the
// sandbox (BytesIn) and came from it (BytesOut). Contents are never recorded.
type PortForwardClosed struct {
	Sandbox    string `json:"sandbox"`
	Port       int    `json:"port"`
	Conn       uint64 `json:"conn"`
	BytesIn    int64  `json:"bytes_in"`
	BytesOut   int64  `json:"bytes_out"`
	DurationMS int64  `json:"duration_ms"`
}

// ProcessStarted (process_started): a command started a process that outlives the call (exec --detach, the
// process routes). Like an exec, it is described by argv[0] only.
type ProcessStarted struct {
	Sandbox    string `json:"sandbox"`
	PID        int    `json:"pid"`
	Tag        string `json:"tag,omitempty"`
	Command    string `json:"command"`
	LifetimeMS int64  `json:"lifetime_ms"` // its bound: past it, its tree is killed
	TTY        bool   `json:"tty,omitempty"`
}

// Reasons a process ended (ProcessEnded.Reason).
const (
	ProcessExitedItself = "exited"          // it ended on its own (a signal sent to it included)
	ProcessLifetime     = "lifetime"        // its lifetime bound passed: its tree was killed
	ProcessKilled       = "killed"          // a caller killed it (its tree)
	ProcessSandboxEnded = "sandbox_stopped" // its sandbox stopped, was removed or recycled
	ProcessChannelEnded = "channel_closed"  // the process that served the sandbox's channel went away
)

// ProcessEnded (process_ended): a process is over, with its tree. ExitCode and Signal are the agent's report
// when there was one (Reason exited, lifetime or killed).
type ProcessEnded struct {
	Sandbox    string `json:"sandbox"`
	PID        int    `json:"pid"`
	Tag        string `json:"tag,omitempty"`
	Reason     string `json:"reason"`
	ExitCode   int    `json:"exit_code"`
	Signal     int    `json:"signal,omitempty"`
	DurationMS int64  `json:"duration_ms"`
}

// SandboxShared (sandbox_shared): a run's first command found its key's sandbox live and ran in it as it was
// (reused, or adopted from the process that had just made it): the run shares a sandbox that other runs of the
// key made and use, with what they left in it. Once per run, before its first exec_started.
type SandboxShared struct {
	Sandbox string `json:"sandbox"`
	Driver  string `json:"driver"`
	Adopted bool   `json:"adopted,omitempty"` // taken over from another process rather than reused
}

// HostBindsDropped (sandbox_host_binds_dropped): the run's driver cannot bind host paths (kubernetes), so the
// shape's host binds were dropped rather than the sandbox refused, and the environment variables whose value
// pointed into a dropped bind's target were withdrawn (names only), so no command is promised a path that is not
// there. Once per run, at admission.
type HostBindsDropped struct {
	Driver    string   `json:"driver"`
	Targets   []string `json:"targets"`             // the dropped binds' targets inside the sandbox (never host paths)
	Withdrawn []string `json:"withdrawn,omitempty"` // the variables withdrawn with them
}

// Origins of a user remapping (UserRemap.Origin).
const (
	RemapDevcontainer = "devcontainer.json" // a user the file names, mapped onto the sandbox's uid
	RemapWorkspace    = "workspace"         // the workspace's files handed over from the key's previous uid
)

// UserRemap (sandbox_user_remap): the sandbox's identity was mapped. With Origin devcontainer.json, the user the
// file names (remoteUser or containerUser, Field) is not created or switched to: commands run as the operator's
// UID:GID, which stands for it. With Origin workspace, the key's sandbox uid changed (a uid range was set or
// changed) and the files of the workspace that FromUID owned were handed over to UID:GID before the sandbox ran.
type UserRemap struct {
	Origin  string `json:"origin"`
	Sandbox string `json:"sandbox,omitempty"`
	Field   string `json:"field,omitempty"`
	User    string `json:"user,omitempty"`
	FromUID *int   `json:"from_uid,omitempty"`
	UID     int    `json:"uid"`
	GID     int    `json:"gid"`
}

// UIDMismatch (sandbox_uid_mismatch_warning): the key's workspace is owned by OwnerUID, not by the sandbox's UID,
// and this sandkeep could not hand it over (it does not run as root): commands may fail to write their own
// workspace. The sandbox runs anyway; run sandkeep as root once, or remove the workspace, to mend it.
type UIDMismatch struct {
	Sandbox  string `json:"sandbox,omitempty"`
	OwnerUID int    `json:"owner_uid"`
	UID      int    `json:"uid"`
}

// ImageEnvPlanted (sandbox_image_env_planted): a new sandbox's image configures environment variables (its ENV
// lines), and every command in the sandbox starts with them, under the variables sandkeep and the spec set
// (Overridden: the image's names the sandbox's own environment replaced). Names only, never values.
type ImageEnvPlanted struct {
	Sandbox    string   `json:"sandbox"`
	Image      string   `json:"image"`
	Names      []string `json:"names"`
	Overridden []string `json:"overridden,omitempty"`
}

// HostStateMounted (sandbox_host_state_mounted): the operator's host_state auto bound its state into the run's
// sandbox: under a tmpfs HOME at the operator's home path (Home), each Bound path at its own absolute path (the git
// identity read-only, the tool caches read-write); Skipped says which candidates were not bound and why (missing
// on the host, nested in or containing the workspace, refused by the mount guard). Paths only, never contents.
type HostStateMounted struct {
	Mode    string          `json:"mode"`
	Home    string          `json:"home"`
	Bound   []HostStatePath `json:"bound"`
	Skipped []HostStatePath `json:"skipped,omitempty"`
}

// HostStatePath is one host_state candidate: its path, and either how it was bound or why it was not.
type HostStatePath struct {
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
	Why      string `json:"why,omitempty"`
}

// ReaperDecision (reaper_removed, reaper_kept): the reaper removed a resource whose owner is provably gone, or
// kept one because something could not be known (a lease or store lookup failed). Reason is one of
// internal/reaper's reasons.
type ReaperDecision struct {
	Kind     string `json:"kind"`
	Resource string `json:"resource"`
	Reason   string `json:"reason"`
}

// HostServiceOpened (host_service_opened): a command of the run can reach the operator's host service Service
// inside its sandbox, at Address (SANDKEEP_SERVICE_<NAME>_URL), with the run's bearer token; the service is open
// while the command runs. Never the token or the operator's URL.
type HostServiceOpened struct {
	Sandbox string `json:"sandbox"`
	Service string `json:"service"`
	Address string `json:"address"`
}

// HostServiceClosed (host_service_closed): the command that opened Service is over: the run's token no longer
// reaches it; Requests counts what it let through meanwhile.
type HostServiceClosed struct {
	Sandbox  string `json:"sandbox"`
	Service  string `json:"service"`
	Requests int64  `json:"requests"`
}

// HostServiceRefused (host_service_refused): a request inside the sandbox to a host service was turned away
// before reaching the operator's endpoint. Reason: token-missing, token-invalid (not the token of a run whose
// command has the service open, e.g. another user's). Rate-limited.
type HostServiceRefused struct {
	Sandbox string `json:"sandbox"`
	Service string `json:"service"`
	Reason  string `json:"reason"`
}

// HostServicesDropped (host_services_dropped): the run's template offers host services that its driver cannot
// carry into the sandbox (kubernetes, the host passthrough, gVisor: no channel directory), so its commands run
// without them and without their variables. Once per run, at admission.
type HostServicesDropped struct {
	Driver   string   `json:"driver"`
	Services []string `json:"services"`
	Why      string   `json:"why"`
}

// NetworkUpdated: a caller replaced the network block of a sandbox's later commands (the E2B front's network
// update), as admitted: Mode "" is the template's network as it is, else none or allowlist with Rules.
type NetworkUpdated struct {
	Sandbox string   `json:"sandbox"`
	Mode    string   `json:"mode"`
	Rules   []string `json:"rules,omitempty"`
}
