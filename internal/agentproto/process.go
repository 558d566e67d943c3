package agentproto

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Processes: a command that outlives its call (a dev server). The host starts one with a Request whose Detach is
// set; the agent answers with a Result that carries the process's PID (or why it did not start) as soon as it
// runs, and keeps it in its process table: its output in a ring buffer per stream, its stdin open when asked,
// its exit status once it ends. Later calls are process operations (FrameProcessOp, a JSON ProcessOp), each
// with an ID of its own like a command's, answered by one FrameProcessReply; an attach streams FrameStdout and
// FrameStderr frames (the ring's bytes, then live output) before its reply, which comes when the process ends
// or the host cancels the attach (FrameCancel with the attach's ID).
//
// Every process and every command with Concurrent set runs under a supervisor of its own (a child
// `sandkeep-agent serve`, a subreaper), so that its tree is told apart from the others' and killed alone.
const (
	FrameProcessOp    FrameType = 'J' // host -> agent: JSON ProcessOp; payload ≤ MaxRequest
	FrameProcessReply FrameType = 'j' // agent -> host: JSON ProcessReply, the last frame of an operation
	FrameSignal       FrameType = 'G' // host -> agent: send the signal in the one-byte payload to a command's process group
	FrameStarted      FrameType = 'S' // agent -> its parent agent: the command runs, its pid (uint32) in the payload
)

// Bounds of processes.
const (
	// MaxProcesses is the most processes an agent keeps (running, and exited ones not yet forgotten); it refuses
	// to start more while that many run, and forgets the oldest exited ones first.
	MaxProcesses = 64
	// DefaultRing and MaxRing bound a process's output ring buffer, per stream.
	DefaultRing = 1 << 20
	MaxRing     = 16 << 20
	// MaxTag is the longest tag a process may carry.
	MaxTag = 128
	// MaxInput is the largest stdin chunk one ProcessOp carries.
	MaxInput = 64 << 10
)

// Detach asks the agent to keep the command running after the request is answered. The request's TimeoutMS is
// the process's lifetime bound: past it, its tree is killed as a command's is at its deadline.
type Detach struct {
	Tag  string `json:"tag,omitempty"`  // an optional name to address it by; unique among running processes
	Ring int64  `json:"ring,omitempty"` // ring buffer per stream, in bytes; 0: DefaultRing
}

// Process operations.
const (
	OpList       = "list"        // every process the agent keeps
	OpAttach     = "attach"      // stream output (replayed from the ring when Replay) until the process ends
	OpInput      = "input"       // write Data to its stdin
	OpCloseStdin = "close_stdin" // close its stdin
	OpSignal     = "signal"      // send Signal to its process group
	OpResize     = "resize"      // set a TTY process's window size
	OpKill       = "kill"        // kill its whole tree (SIGTERM, grace, SIGKILL), as at its lifetime bound
)

// ProcessOp is one operation on the agent's processes. A process is chosen by PID, or by Tag when PID is 0.
type ProcessOp struct {
	Version int         `json:"v"`
	ID      uint32      `json:"id"`
	Op      string      `json:"op"`
	PID     int         `json:"pid,omitempty"`
	Tag     string      `json:"tag,omitempty"`
	Data    []byte      `json:"data,omitempty"`   // OpInput
	Signal  int         `json:"signal,omitempty"` // OpSignal: 1..64
	Size    *WindowSize `json:"size,omitempty"`   // OpResize
	Replay  bool        `json:"replay,omitempty"` // OpAttach: the ring's bytes first
	Quiet   bool        `json:"quiet,omitempty"`  // OpAttach: no output at all, only the end
	// Snapshot (OpAttach): the ring's bytes, then the reply at once (Detached while it runs), as `docker logs`
	// without -f. It implies Replay.
	Snapshot bool `json:"snapshot,omitempty"`
}

// Validate checks an operation before it is sent or acted on.
func (op *ProcessOp) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: process op: %s", ErrBadRequest, fmt.Sprintf(format, a...))
	}
	if op.Version != Version {
		return bad("protocol version %d, want %d", op.Version, Version)
	}
	if op.PID < 0 {
		return bad("negative pid")
	}
	if err := CheckTag(op.Tag); err != nil {
		return err
	}
	switch op.Op {
	case OpList:
		return nil
	case OpAttach, OpCloseStdin, OpKill:
	case OpInput:
		if len(op.Data) > MaxInput {
			return bad("input of %d bytes, more than %d", len(op.Data), MaxInput)
		}
	case OpSignal:
		if op.Signal < 1 || op.Signal > 64 {
			return bad("signal %d outside 1..64", op.Signal)
		}
	case OpResize:
		if op.Size == nil {
			return bad("resize without a size")
		}
		if err := op.Size.Check(); err != nil {
			return err
		}
	default:
		return bad("unknown op %q", op.Op)
	}
	if op.PID == 0 && op.Tag == "" {
		return bad("%s names no process (pid or tag)", op.Op)
	}
	return nil
}

// CheckTag accepts "" or printable UTF-8 text of at most MaxTag bytes.
func CheckTag(tag string) error {
	if len(tag) > MaxTag || !utf8.ValidString(tag) || strings.ContainsFunc(tag, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("%w: tag must be printable text of at most %d bytes", ErrBadRequest, MaxTag)
	}
	return nil
}

// Reply codes of a ProcessReply that is not a success.
const (
	ReplyNotFound = "not_found" // no process with that pid or tag
	ReplyExited   = "exited"    // the process has ended: no input, signal or resize
	ReplyInvalid  = "invalid"   // the operation does not apply (a resize of a process without a TTY, stdin not open)
)

// ProcessReply answers one ProcessOp.
type ProcessReply struct {
	ID        uint32        `json:"id"`
	Code      string        `json:"code,omitempty"`  // "" on success, else a Reply* code
	Error     string        `json:"error,omitempty"` // a sentence, with Code
	Processes []ProcessInfo `json:"processes,omitempty"`
	Detached  bool          `json:"detached,omitempty"` // OpAttach: the host cancelled it; the process runs on
}

// ProcessInfo describes one process of the agent's table.
type ProcessInfo struct {
	PID       int      `json:"pid"`
	Tag       string   `json:"tag,omitempty"`
	Argv      []string `json:"argv"`
	Workdir   string   `json:"workdir,omitempty"`
	TTY       bool     `json:"tty,omitempty"`
	Stdin     bool     `json:"stdin,omitempty"` // its stdin is open for input
	StartedMS int64    `json:"started_ms"`      // Unix milliseconds, by the sandbox's clock
	Running   bool     `json:"running"`
	// Exit is its end, as a command's Result reports it (exit code, signal, timed out at its lifetime bound,
	// cancelled by a kill); nil while it runs.
	Exit *Result `json:"exit,omitempty"`
	// StdoutDropped and StderrDropped count the bytes that left the ring buffer before an attach replayed them.
	StdoutDropped int64 `json:"stdout_dropped,omitempty"`
	StderrDropped int64 `json:"stderr_dropped,omitempty"`
}

// maxInfoArgv bounds what one ProcessInfo repeats of a process's argv, so that a list of MaxProcesses fits in a
// reply frame.
const maxInfoArgv = 8 << 10

// ClipArgv returns argv cut to at most maxInfoArgv bytes in all (an argument cut short ends with "...").
func ClipArgv(argv []string) []string {
	out := make([]string, 0, len(argv))
	left := maxInfoArgv
	for _, a := range argv {
		if len(a) > left {
			cut := a[:max(left, 0)]
			for len(cut) > 0 && !utf8.ValidString(cut) {
				cut = cut[:len(cut)-1]
			}
			return append(out, cut+"...")
		}
		left -= len(a)
		out = append(out, a)
	}
	return out
}

// DecodeProcessOp parses a FrameProcessOp payload for the frame's id and validates it.
func DecodeProcessOp(payload []byte, id uint32) (ProcessOp, error) {
	var op ProcessOp
	if err := json.Unmarshal(payload, &op); err != nil {
		return ProcessOp{}, fmt.Errorf("%w: process op: %w", ErrBadRequest, err)
	}
	if op.ID != id {
		return ProcessOp{}, fmt.Errorf("%w: process op id %d in a frame for %d", ErrBadRequest, op.ID, id)
	}
	return op, op.Validate()
}

// DecodeProcessReply parses a FrameProcessReply payload for the operation id and checks what the host relies
// on: the ID, a known code, and each process's pid and exit. Anything else wraps ErrProtocol.
func DecodeProcessReply(payload []byte, id uint32) (ProcessReply, error) {
	var rep ProcessReply
	if err := json.Unmarshal(payload, &rep); err != nil {
		return ProcessReply{}, fmt.Errorf("%w: process reply: %w", ErrProtocol, err)
	}
	switch {
	case rep.ID != id:
		return ProcessReply{}, fmt.Errorf("%w: process reply for %d, want %d", ErrProtocol, rep.ID, id)
	case rep.Code != "" && rep.Code != ReplyNotFound && rep.Code != ReplyExited && rep.Code != ReplyInvalid:
		return ProcessReply{}, fmt.Errorf("%w: process reply code %q", ErrProtocol, rep.Code)
	case len(rep.Processes) > MaxProcesses:
		return ProcessReply{}, fmt.Errorf("%w: %d processes in a reply", ErrProtocol, len(rep.Processes))
	}
	for _, p := range rep.Processes {
		if p.PID <= 0 {
			return ProcessReply{}, fmt.Errorf("%w: process pid %d", ErrProtocol, p.PID)
		}
		if p.Exit != nil {
			if body, err := json.Marshal(p.Exit); err != nil {
				return ProcessReply{}, fmt.Errorf("%w: process exit: %w", ErrProtocol, err)
			} else if _, err := DecodeResult(body, p.Exit.ID); err != nil {
				return ProcessReply{}, err
			}
		}
	}
	return rep, nil
}

// EncodePID and DecodePID are the payload of FrameStarted.
func EncodePID(pid int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(pid)) }

// DecodePID parses a FrameStarted payload.
func DecodePID(p []byte) (int, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("%w: started payload of %d bytes", ErrProtocol, len(p))
	}
	pid := int(binary.BigEndian.Uint32(p))
	if pid <= 0 || pid > 1<<22 {
		return 0, fmt.Errorf("%w: started pid %d", ErrProtocol, pid)
	}
	return pid, nil
}
