// Package agentproto is the wire between the host and sandkeep-agent: the request that starts one command, the
// frames that carry its stdin, stdout, stderr and cancellation, and the final report. It also holds the output
// bounds (UTF-8-safe truncation) and the exit status mapping, so that the host and the agent apply the same rules.
//
// The host never trusts what comes from the agent: every frame is length-checked, every stream is re-bounded on
// the host side, and anything malformed is an ErrProtocol.
package agentproto

import "errors"

// Version is the protocol version the host sends and the agent checks.
const Version = 1

// Bounds on what either side accepts.
const (
	MaxFrame       = 64 << 10 // largest frame payload, in bytes
	MaxRequest     = 1 << 20  // largest encoded Request, in bytes
	DefaultLimit   = 1 << 20  // default per-stream output limit
	MaxOutputLimit = 64 << 20 // largest per-stream output limit a request may ask for
	MaxStreamLimit = 1 << 62  // largest stdout limit of a Stream request
)

// ErrProtocol marks a broken channel: garbage, a forged or oversized frame, or a stream cut before the report.
// The host recycles a sandbox whose channel broke.
var ErrProtocol = errors.New("agent protocol violation")

// Request starts one command. Argv is run directly (no shell). Workdir is absolute and already validated by the
// host; the agent creates it when missing. Env entries ("K=V") are added to the agent's own environment.
type Request struct {
	Version     int      `json:"v"`
	ID          uint32   `json:"id"`
	Argv        []string `json:"argv"`
	Workdir     string   `json:"workdir"`
	Env         []string `json:"env,omitempty"`
	TimeoutMS   int64    `json:"timeout_ms"`
	GraceMS     int64    `json:"grace_ms"`
	StdoutLimit int64    `json:"stdout_limit"`
	StderrLimit int64    `json:"stderr_limit"`
	Stdin       bool     `json:"stdin,omitempty"` // false: the command's stdin is /dev/null
	// TTY, when set, runs the command on a new pseudo-terminal of this size, as its controlling terminal: its
	// stdin, stdout and stderr are the terminal, its output comes in FrameStdout frames only (bounded by
	// StdoutLimit), and FrameResize frames change the size. A Ctrl-C byte on stdin becomes SIGINT for the
	// terminal's foreground process group, by the terminal's own line discipline.
	TTY *WindowSize `json:"tty,omitempty"`
	// Stream marks a command whose stdout is data the host passes on as it comes and never keeps (the file API's
	// downloads through the agent, `sandkeep-agent fs`): its StdoutLimit may be up to MaxStreamLimit instead of
	// MaxOutputLimit. Everything else is as for any command; an agent that predates the field refuses such a
	// limit, so nothing goes unbounded by mistake.
	Stream bool `json:"stream,omitempty"`
	// Concurrent runs the command beside the agent's others, under a supervisor of its own (see process.go):
	// the host sends it only for commands it lets run at once.
	Concurrent bool `json:"concurrent,omitempty"`
	// Detach starts a process that outlives the request (process.go); TimeoutMS is its lifetime bound.
	Detach *Detach `json:"detach,omitempty"`
	// Bounded and Started are between an agent and the supervisor it runs a process under: the parent bounds the
	// output itself (its ring buffers), so both limits may be up to MaxStreamLimit; and the supervisor sends
	// FrameStarted with the command's pid once it runs.
	Bounded bool `json:"bounded,omitempty"`
	Started bool `json:"started,omitempty"`
}

// Result is the agent's final report of one command.
type Result struct {
	ID              uint32 `json:"id"`
	ExitCode        int    `json:"exit_code"`        // 0..255, or 128+signal when killed by a signal
	Signal          int    `json:"signal,omitempty"` // the signal that killed the command, 0 when it exited
	TimedOut        bool   `json:"timed_out"`        // the deadline passed and the tree was killed
	Cancelled       bool   `json:"cancelled,omitempty"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	DurationMS      int64  `json:"duration_ms"`
	StartError      string `json:"start_error,omitempty"` // why the command could not start (exit 126/127)
	PID             int    `json:"pid,omitempty"`         // a Detach request: the process runs with this pid
}
