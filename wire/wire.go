// Package wire declares the JSON bodies of sandkeep's HTTP API (/v1) once, for the server (internal/api) and
// the Go client (package client) alike. The OpenAPI document the server serves (GET /v1/openapi.json)
// describes the same bodies under the names used here; TestWireAgreesWithOpenAPI holds the two together, so a
// field added on one side and not the other fails the build's tests rather than a caller.
//
// Durations are seconds (JSON numbers) on the wire; the client's own request types take time.Duration and
// fill these.
package wire

import "time"

// Error is the body of every failure: a stable code (docs/ERRORS.md), a message and a fix hint.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Hint    string `json:"hint"`
}

// ExecRequest is POST /v1/sandboxes/{user}/exec. Exactly one of Argv and Command is set.
type ExecRequest struct {
	Argv        []string          `json:"argv,omitempty"`    // run directly, without a shell
	Command     string            `json:"command,omitempty"` // run as sh -c <command>
	Workdir     string            `json:"workdir,omitempty"` // relative to /workspace, or absolute under it
	Env         map[string]string `json:"env,omitempty"`     // added to the sandbox's environment
	Timeout     float64           `json:"timeout,omitempty"` // seconds, 1..86400; 0 or absent: 120
	Stdin       *string           `json:"stdin,omitempty"`   // absent: the command reads /dev/null
	OutputLimit int64             `json:"output_limit,omitempty"`
	RunID       string            `json:"run_id,omitempty"`
	// Template and Trust are what the command's implicit run is admitted with (ignored with run_id): one of the
	// operator's templates ("" the tenant's default) and trusted or untrusted (lower only).
	Template string `json:"template,omitempty"`
	Trust    string `json:"trust,omitempty"`
	// Network narrows the run's network for this command: mode none, or an allowlist within the template's
	// (both must allow a request). Anything wider is 403 NETWORK_WIDENED.
	Network *Network `json:"network,omitempty"`
}

// Network is a caller's network block: for one command, a request must pass it and the run's policy both.
type Network struct {
	Mode   string   `json:"mode,omitempty"` // none or allowlist
	Preset string   `json:"preset,omitempty"`
	Rules  []string `json:"rules,omitempty"`
}

// ExecResult is the outcome of one command: the fields of `sandkeep exec --json`, and the request id.
type ExecResult struct {
	ExitCode        int        `json:"exit_code"` // 0..255; 128+N when killed by signal N; 124 when TimedOut
	TimedOut        bool       `json:"timed_out"` // the deadline passed and the process tree was killed
	Stdout          string     `json:"stdout"`    // empty when the output was streamed
	Stderr          string     `json:"stderr"`
	StdoutTruncated bool       `json:"stdout_truncated"`
	StderrTruncated bool       `json:"stderr_truncated"`
	DurationMS      int64      `json:"duration_ms"`
	Transport       string     `json:"transport"` // how the command reached the agent: agent (channel) or exec
	Sandbox         SandboxRef `json:"sandbox"`
	RequestID       string     `json:"request_id"`
}

// SandboxRef names the sandbox a command ran in.
type SandboxRef struct {
	Name   string `json:"name"`
	ID     string `json:"id"`
	Driver string `json:"driver"`
	Tenant string `json:"tenant"`
	User   string `json:"user"`
}

// Sandbox describes one sandbox, as `sandkeep ps` shows it.
type Sandbox struct {
	Tenant    string     `json:"tenant"`
	User      string     `json:"user"`
	Key       string     `json:"key"`
	Name      string     `json:"name"`
	ID        string     `json:"id"`
	State     string     `json:"state"`
	Image     string     `json:"image"`
	Template  string     `json:"template,omitempty"` // the operator template it was made for
	CreatedAt time.Time  `json:"created_at"`
	LastUsed  time.Time  `json:"last_used,omitzero"`
	IdleFor   string     `json:"idle_for"`
	Disk      *DiskUsage `json:"disk,omitempty"` // the workspace quota's use; nil without one
}

// DiskUsage is what a quota'd workspace holds: bytes and inodes used, and the file system's size in each.
type DiskUsage struct {
	Bytes       int64 `json:"bytes"`
	BytesLimit  int64 `json:"bytes_limit"`
	Inodes      int64 `json:"inodes"`
	InodesLimit int64 `json:"inodes_limit"`
}

// SandboxList is GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// RunStart is POST /v1/sandboxes/{user}/runs: what a caller may say about a run.
type RunStart struct {
	Template string `json:"template,omitempty"` // one of GET /v1/templates; "" the tenant's default
	Trust    string `json:"trust,omitempty"`    // untrusted lowers the token's trust; it is never raised
}

// RunAdmitted is the answer of RunStart: the run as admission recorded it. Commands attach with run_id.
type RunAdmitted struct {
	ID        string   `json:"id,omitempty"`
	Tenant    string   `json:"tenant"`
	User      string   `json:"user"`
	Mode      string   `json:"mode"`   // the resolved mode: none, auto or inline
	Source    string   `json:"source"` // the tier that chose it: cli, spec, env or default
	Trust     string   `json:"trust"`
	Driver    string   `json:"driver,omitempty"`
	Admission string   `json:"admission"` // admitted or refused
	Template  string   `json:"template,omitempty"`
	Warnings  []string `json:"warnings,omitempty"`
	Notice    string   `json:"notice,omitempty"`
	Dropped   string   `json:"dropped,omitempty"`
	RequestID string   `json:"request_id"`
}

// RunFinish is POST /v1/runs/{id}/finish.
type RunFinish struct {
	Failed bool `json:"failed,omitempty"`
}

// TemplateList is GET /v1/templates.
type TemplateList struct {
	Templates []string `json:"templates"`
}

// ForkRequest is POST /v1/sandboxes/{user}/fork.
type ForkRequest struct {
	To    string `json:"to"`
	Trust string `json:"trust,omitempty"` // untrusted lowers the token's trust; it is never raised
}

// WindowSize is a terminal's size in character cells.
type WindowSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// TTYStart is the first message of GET /v1/sandboxes/{user}/exec/tty: the command and its terminal's size.
type TTYStart struct {
	ExecRequest
	TTY *WindowSize `json:"tty,omitempty"`
}

// TTYControl is a client's text message on the terminal's WebSocket: a resize.
type TTYControl struct {
	Resize *WindowSize `json:"resize,omitempty"`
}

// TTYFinal is the server's last message on the terminal's WebSocket: the result, or the error.
type TTYFinal struct {
	Result *ExecResult `json:"result,omitempty"`
	Error  *Error      `json:"error,omitempty"`
}

// ForwardPort is one of the repository's devcontainer.json forwardPorts and what port forwarding does with it.
type ForwardPort struct {
	Entry     string `json:"entry"`               // as devcontainer.json writes it: 3000, "localhost:3000", "db:5432"
	Port      int    `json:"port,omitempty"`      // the port inside the sandbox; 0 when Entry is not a port
	Companion string `json:"companion,omitempty"` // the compose companion listening on Port, for "SERVICE:PORT"
	Forwarded bool   `json:"forwarded"`
	Why       string `json:"why,omitempty"` // why not, when not Forwarded
}

// ForwardPortList is GET /v1/sandboxes/{user}/ports.
type ForwardPortList struct {
	Ports []ForwardPort `json:"ports"`
}

// ProcessStart is POST /v1/sandboxes/{user}/processes. Exactly one of Argv and Command is set.
type ProcessStart struct {
	Argv     []string          `json:"argv,omitempty"`
	Command  string            `json:"command,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Lifetime float64           `json:"lifetime,omitempty"` // seconds, at most 86400; 0 or absent: 3600
	Stdin    bool              `json:"stdin,omitempty"`    // keep its stdin open for input
	TTY      *WindowSize       `json:"tty,omitempty"`      // run it on a pseudo-terminal of this size
	Tag      string            `json:"tag,omitempty"`
	// BufferLimit is its output ring per stream, in bytes (0: 1 MiB, at most 16 MiB).
	BufferLimit int64  `json:"buffer_limit,omitempty"`
	RunID       string `json:"run_id,omitempty"`
	Template    string `json:"template,omitempty"`
	Trust       string `json:"trust,omitempty"`
}

// Process is one process of a sandbox.
type Process struct {
	PID     int       `json:"pid"`
	Tag     string    `json:"tag,omitempty"`
	Argv    []string  `json:"argv"`
	Workdir string    `json:"workdir,omitempty"`
	TTY     bool      `json:"tty,omitempty"`
	Stdin   bool      `json:"stdin,omitempty"` // its stdin is open for input
	Started time.Time `json:"started"`
	Running bool      `json:"running"`
	// Once not Running: its exit code (128+signal when a signal killed it), whether its lifetime passed or a
	// caller killed it, and why it never ran (exit 126/127).
	ExitCode      int    `json:"exit_code"`
	Signal        int    `json:"signal,omitempty"`
	TimedOut      bool   `json:"timed_out,omitempty"`
	Killed        bool   `json:"killed,omitempty"`
	StartError    string `json:"start_error,omitempty"`
	StdoutDropped int64  `json:"stdout_dropped,omitempty"`
	StderrDropped int64  `json:"stderr_dropped,omitempty"`
	Sandbox       string `json:"sandbox"`
	RequestID     string `json:"request_id,omitempty"` // on the answer of a start
}

// ProcessList is GET /v1/sandboxes/{user}/processes.
type ProcessList struct {
	Processes []Process `json:"processes"`
}

// ProcessInput is POST .../processes/{ref}/input: data (text or base64) for its stdin, or close it.
type ProcessInput struct {
	Data    string `json:"data,omitempty"`
	DataB64 string `json:"data_b64,omitempty"`
	Close   bool   `json:"close,omitempty"`
}

// ProcessSignal is POST .../processes/{ref}/signal.
type ProcessSignal struct {
	Signal string `json:"signal"`
}

// SnapshotCreate is POST /v1/sandboxes/{user}/snapshots.
type SnapshotCreate struct {
	Name string `json:"name,omitempty"` // "" for a fresh name
}

// SnapshotRestore is POST /v1/snapshots/{name}/restore.
type SnapshotRestore struct {
	User    string `json:"user"`
	Trust   string `json:"trust,omitempty"`
	Replace bool   `json:"replace,omitempty"` // onto a user that has a sandbox: stopped, its workspace replaced
}

// Snapshot is one snapshot of a workspace.
type Snapshot struct {
	Name      string    `json:"name"`
	Tenant    string    `json:"tenant"`
	User      string    `json:"user"` // whose workspace it was taken from
	Template  string    `json:"template,omitempty"`
	Image     string    `json:"image,omitempty"`
	Digest    string    `json:"digest"` // sha256:<hex> of the archive
	Bytes     int64     `json:"bytes"`
	CreatedAt time.Time `json:"created_at"`
}

// SnapshotList is GET /v1/snapshots.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// FileWritten is the answer of a file upload.
type FileWritten struct {
	Path  string `json:"path"`
	Bytes int64  `json:"bytes"`
}
