package mcpserver

import (
	"bytes"
	"context"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/processes"
)

// The process tools: a command that outlives its call (a dev server, a watcher) started with start_process,
// then listed, read, written to and ended by pid or tag while exec runs other commands beside it.
const (
	ToolStartProcess = "start_process"
	ToolProcesses    = "list_processes"
	ToolProcessOut   = "process_output"
	ToolProcessInput = "process_input"
	ToolKillProcess  = "kill_process"
)

// StartProcessInput is the start_process tool's input.
type StartProcessInput struct {
	Command         string            `json:"command,omitempty" jsonschema:"a shell command line, run with sh -c; give this or argv, not both"`
	Argv            []string          `json:"argv,omitempty" jsonschema:"a program and its arguments, run directly; give this or command, not both"`
	Workdir         string            `json:"workdir,omitempty" jsonschema:"the directory to run in: relative to /workspace or absolute under it; default /workspace"`
	Env             map[string]string `json:"env,omitempty" jsonschema:"environment variables added for this process, name to value"`
	Tag             string            `json:"tag,omitempty" jsonschema:"a name for the process, unique among the sandbox's running processes; the other process tools take it instead of the pid"`
	LifetimeSeconds int               `json:"lifetime_seconds,omitempty" jsonschema:"seconds after which the process and everything it started are killed; default 3600, at most 86400"`
	Stdin           bool              `json:"stdin,omitempty" jsonschema:"keep the process's standard input open for process_input (default: it reads end of file)"`
}

// ProcessRefInput names one process.
type ProcessRefInput struct {
	PID int    `json:"pid,omitempty" jsonschema:"the process's pid, as start_process or list_processes gave it"`
	Tag string `json:"tag,omitempty" jsonschema:"the process's tag (used when pid is not given)"`
}

// ProcessInfo is one process as the tools describe it.
type ProcessInfo struct {
	PID        int      `json:"pid" jsonschema:"its pid in the sandbox"`
	Tag        string   `json:"tag,omitempty" jsonschema:"its tag"`
	Argv       []string `json:"argv" jsonschema:"its command"`
	Running    bool     `json:"running" jsonschema:"true while it runs"`
	ExitCode   int      `json:"exit_code" jsonschema:"once it ended: its exit status (128+N when signal N killed it)"`
	Killed     bool     `json:"killed,omitempty" jsonschema:"a caller killed it"`
	TimedOut   bool     `json:"timed_out,omitempty" jsonschema:"its lifetime passed"`
	StartError string   `json:"start_error,omitempty" jsonschema:"why it could not start (exit 127: not found, 126: not executable)"`
	Stdin      bool     `json:"stdin,omitempty" jsonschema:"its standard input is open for process_input"`
}

func infoOf(p *processes.Process) ProcessInfo {
	return ProcessInfo{PID: p.PID, Tag: p.Tag, Argv: p.Argv, Running: p.Running, ExitCode: p.ExitCode, Killed: p.Killed,
		TimedOut: p.TimedOut, StartError: p.StartError, Stdin: p.Stdin}
}

// ProcessList is the list_processes tool's result.
type ProcessList struct {
	Processes []ProcessInfo `json:"processes" jsonschema:"the sandbox's processes, running and recently ended"`
}

// ProcessOutputInput is the process_output tool's input.
type ProcessOutputInput struct {
	ProcessRefInput
	WaitSeconds int `json:"wait_seconds,omitempty" jsonschema:"wait up to this many seconds for the process to end first (0: answer at once); at most 300"`
}

// ProcessOutput is the process_output tool's result.
type ProcessOutput struct {
	ProcessInfo
	Stdout          string `json:"stdout" jsonschema:"the end of what it wrote to standard output that its buffer still holds"`
	Stderr          string `json:"stderr" jsonschema:"the same for standard error"`
	StdoutTruncated bool   `json:"stdout_truncated" jsonschema:"true when only the end of stdout is here"`
	StderrTruncated bool   `json:"stderr_truncated" jsonschema:"true when only the end of stderr is here"`
}

// ProcessInputInput is the process_input tool's input.
type ProcessInputInput struct {
	ProcessRefInput
	Data  string `json:"data,omitempty" jsonschema:"text to write to the process's standard input"`
	Close bool   `json:"close,omitempty" jsonschema:"close its standard input after writing: it reads end of file"`
}

// KillProcessInput is the kill_process tool's input.
type KillProcessInput struct {
	ProcessRefInput
	Signal string `json:"signal,omitempty" jsonschema:"send this one signal (TERM, INT, HUP...) to its process group instead of killing it and everything it started"`
}

// Done is the result of a tool that only acts.
type Done struct {
	OK bool `json:"ok" jsonschema:"true: done"`
}

var processTools = struct{ start, list, out, input, kill *mcp.Tool }{
	start: &mcp.Tool{Name: ToolStartProcess, Title: "Start a background process",
		Description: "Start a command that keeps running after this call (a dev server, a watcher) in the sandbox, and " +
			"return its pid at once. exec runs other commands beside it; read its output with process_output, end it " +
			"with kill_process. It is killed when its lifetime passes or the sandbox stops.",
		InputSchema: inputSchema[StartProcessInput](nil)},
	list: &mcp.Tool{Name: ToolProcesses, Title: "List background processes",
		Description: "List the sandbox's background processes, running and recently ended.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}, InputSchema: inputSchema[struct{}](nil)},
	out: &mcp.Tool{Name: ToolProcessOut, Title: "Read a process's output",
		Description: "Return what a background process wrote (the end of it its buffer holds), optionally waiting for it to end first.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}, InputSchema: inputSchema[ProcessOutputInput](nil)},
	input: &mcp.Tool{Name: ToolProcessInput, Title: "Write to a process",
		Description: "Write text to a background process's standard input (started with stdin), and/or close it.",
		InputSchema: inputSchema[ProcessInputInput](nil)},
	kill: &mcp.Tool{Name: ToolKillProcess, Title: "Kill a process",
		Description: "Kill a background process and everything it started (or send it one signal).",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(true)}, InputSchema: inputSchema[KillProcessInput](nil)},
}

func (t *tools) registerProcesses(s *mcp.Server) {
	mcp.AddTool(s, processTools.start, handle(t, ToolStartProcess, t.startProcess))
	mcp.AddTool(s, processTools.list, handle(t, ToolProcesses, t.processes))
	mcp.AddTool(s, processTools.out, handle(t, ToolProcessOut, t.processOutput))
	mcp.AddTool(s, processTools.input, handle(t, ToolProcessInput, t.processInput))
	mcp.AddTool(s, processTools.kill, handle(t, ToolKillProcess, t.killProcess))
}

func (t *tools) procs() (service.ProcessBackend, error) {
	if pb, ok := t.b.(service.ProcessBackend); ok {
		return pb, nil
	}
	return nil, fault.New(fault.ProcessUnavailable, "run commands with exec instead", "this server has no background processes")
}

func (in ProcessRefInput) ref() (processes.Ref, error) {
	if in.PID <= 0 && in.Tag == "" {
		return processes.Ref{}, fault.New(fault.InvalidArgument, "give the pid or the tag start_process returned", "no process named")
	}
	return processes.Ref{PID: max(in.PID, 0), Tag: in.Tag}, nil
}

func (t *tools) startProcess(ctx context.Context, in StartProcessInput) (ProcessInfo, error) {
	pb, err := t.procs()
	if err != nil {
		return ProcessInfo{}, err
	}
	ereq, err := execRequest(ExecInput{Command: in.Command, Argv: in.Argv, Workdir: in.Workdir, Env: in.Env}, t.opts.OutputLimit)
	if err != nil {
		return ProcessInfo{}, err
	}
	p, err := pb.StartProcess(ctx, t.key, processes.StartRequest{Argv: ereq.Argv, Workdir: ereq.Workdir, Env: ereq.Env,
		Lifetime: time.Duration(in.LifetimeSeconds) * time.Second, Stdin: in.Stdin, Tag: in.Tag, RequestID: t.requestID})
	if err != nil {
		return ProcessInfo{}, err
	}
	return infoOf(p), nil
}

func (t *tools) processes(ctx context.Context, _ struct{}) (ProcessList, error) {
	pb, err := t.procs()
	if err != nil {
		return ProcessList{}, err
	}
	ps, err := pb.Processes(ctx, t.key)
	if err != nil {
		return ProcessList{}, err
	}
	out := ProcessList{Processes: []ProcessInfo{}}
	for i := range ps {
		out.Processes = append(out.Processes, infoOf(&ps[i]))
	}
	return out, nil
}

func (t *tools) processOutput(ctx context.Context, in ProcessOutputInput) (ProcessOutput, error) {
	pb, err := t.procs()
	if err != nil {
		return ProcessOutput{}, err
	}
	ref, err := in.ref()
	if err != nil {
		return ProcessOutput{}, err
	}
	if in.WaitSeconds < 0 || in.WaitSeconds > 300 {
		return ProcessOutput{}, fault.New(fault.InvalidArgument, "give wait_seconds between 0 and 300", "wait_seconds %d is out of range", in.WaitSeconds)
	}
	if in.WaitSeconds > 0 {
		wctx, cancel := context.WithTimeout(ctx, time.Duration(in.WaitSeconds)*time.Second)
		_, werr := pb.AttachProcess(wctx, t.key, ref, processes.AttachOptions{})
		cancel()
		if werr != nil && wctx.Err() == nil {
			return ProcessOutput{}, werr
		}
	}
	var stdout, stderr bytes.Buffer
	p, err := pb.AttachProcess(ctx, t.key, ref, processes.AttachOptions{Stdout: &stdout, Stderr: &stderr, Snapshot: true})
	if err != nil {
		return ProcessOutput{}, err
	}
	out := ProcessOutput{ProcessInfo: infoOf(p)}
	out.Stdout, out.StdoutTruncated = tail(stdout.Bytes(), t.opts.ResultLimit)
	out.Stderr, out.StderrTruncated = tail(stderr.Bytes(), t.opts.ResultLimit)
	out.StdoutTruncated = out.StdoutTruncated || p.StdoutDropped > 0
	out.StderrTruncated = out.StderrTruncated || p.StderrDropped > 0
	return out, nil
}

// tail keeps the last limit bytes of b, from a character's start, as text (invalid UTF-8 replaced).
func tail(b []byte, limit int) (string, bool) {
	cut := len(b) > limit
	if cut {
		b = b[len(b)-limit:]
		for len(b) > 0 && !utf8.RuneStart(b[0]) {
			b = b[1:]
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), cut
}

func (t *tools) processInput(ctx context.Context, in ProcessInputInput) (Done, error) {
	pb, err := t.procs()
	if err != nil {
		return Done{}, err
	}
	ref, err := in.ref()
	if err != nil {
		return Done{}, err
	}
	if in.Data == "" && !in.Close {
		return Done{}, fault.New(fault.InvalidArgument, "give data, or close: true", "nothing to write")
	}
	if in.Data != "" {
		if err := pb.SendInput(ctx, t.key, ref, []byte(in.Data)); err != nil {
			return Done{}, err
		}
	}
	if in.Close {
		if err := pb.CloseStdin(ctx, t.key, ref); err != nil {
			return Done{}, err
		}
	}
	return Done{OK: true}, nil
}

func (t *tools) killProcess(ctx context.Context, in KillProcessInput) (Done, error) {
	pb, err := t.procs()
	if err != nil {
		return Done{}, err
	}
	ref, err := in.ref()
	if err != nil {
		return Done{}, err
	}
	if in.Signal != "" {
		sig, err := processes.ParseSignal(in.Signal)
		if err != nil {
			return Done{}, err
		}
		return Done{OK: true}, pb.SignalProcess(ctx, t.key, ref, syscall.Signal(sig))
	}
	return Done{OK: true}, pb.KillProcess(ctx, t.key, ref)
}
