package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/sandkeep/sandkeep/internal/e2b/proto/process"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	skproc "github.com/sandkeep/sandkeep/processes"
)

// The E2B process service on the engine's process model: a command started through E2B is one of the engine's
// processes (the agent supervises it, keeps its output in a ring and its tree under its lifetime bound), so it
// is the same process `sandkeep proc ls`, the native API, the Go SDK and MCP see, admitted and recorded (its
// run, process_started and process_ended) as theirs are, with the sandbox's network block carried to its
// admission (network.go). Where the engine has no processes (the kubernetes driver with the exec transport or
// without its channel: PROCESS_UNAVAILABLE), the front falls back to its own table of commands on the exec path
// (proc.go), which only the E2B front sees.

// lifetimeSlack is how long a command outlives its caller's deadline (the SDK's timeoutMs): the caller sees its
// own deadline pass (TimeoutError), not an exit its lifetime bound caused a moment earlier.
const lifetimeSlack = time.Second

// engineProcs is the engine's process model behind b, unless the engine said it has none.
func (f *Front) engineProcs(b service.Backend) (service.ProcessBackend, bool) {
	if f.noEngineProcs.Load() {
		return nil, false
	}
	pb, ok := b.(service.ProcessBackend)
	return pb, ok
}

// unavailable notes that the engine has no processes (PROCESS_UNAVAILABLE), so the front runs its commands on
// the exec path from now on; it reports whether err said so.
func (f *Front) unavailable(err error) bool {
	if !fault.Is(err, fault.ProcessUnavailable) {
		return false
	}
	if !f.noEngineProcs.Swap(true) {
		f.log.Info("e2b: the engine has no processes here; commands run on the exec path", "reason", err)
	}
	return true
}

// noProcesses reports whether err, a start's, says that the engine has no processes here, so that the front
// runs its commands on the exec path from now on. A start can be PROCESS_UNAVAILABLE for its own network too (a
// network that inspects TLS on the kubernetes driver: its CA bundle has one path per pod); that one is the
// command's answer, refused before anything started, and the engine's list, which asks nothing of a network,
// tells the two apart.
func (f *Front) noProcesses(ctx context.Context, sc *sandboxCtx, pb service.ProcessBackend, err error) bool {
	if !fault.Is(err, fault.ProcessUnavailable) {
		return false
	}
	if _, lerr := pb.Processes(ctx, sc.key); !fault.Is(lerr, fault.ProcessUnavailable) {
		return false
	}
	return f.unavailable(err)
}

// procErr is the Connect error of a process call: an ended process is not found (the SDK's kill answers false).
func (f *Front) procErr(r *http.Request, err error) error {
	if fault.Is(err, fault.ProcessExited) || f.unavailable(err) {
		return connect.NewError(connect.CodeNotFound, err)
	}
	return f.connectErr(r, err)
}

// startRequest is an E2B start as the engine's process.
func startRequest(sc *sandboxCtx, req *process.StartRequest, argv []string, workdir string, env []string, lifetime time.Duration, requestID string) skproc.StartRequest {
	sr := skproc.StartRequest{Argv: argv, Workdir: workdir, Env: env, Lifetime: lifetime, Stdin: req.GetStdin(),
		Tag: req.GetTag(), Template: sc.rec.OpTemplate, RequestID: requestID}
	if req.Pty != nil {
		ws := size(req.Pty)
		sr.TTY, sr.Stdin = &ws, true // a terminal's input is its keyboard
	}
	return sr
}

// streamProcess sends pid's output as data events (its ring buffer first when replay is set), keepalives while
// it is quiet, and its end event once it ends; it returns when the process ended or ctx did (the process runs
// on).
func (f *Front) streamProcess(ctx context.Context, r *http.Request, sc *sandboxCtx, pb service.ProcessBackend, pid int, tty, replay bool, send func(*process.ProcessEvent) error) error {
	var mu sync.Mutex // one sender at a time: the attach's writes and the keepalives
	locked := func(ev *process.ProcessEvent) error {
		mu.Lock()
		defer mu.Unlock()
		return send(ev)
	}
	opts := skproc.AttachOptions{Replay: replay}
	if tty {
		opts.Stdout = sendWriter{send: locked, kind: 3}
	} else {
		opts.Stdout, opts.Stderr = sendWriter{send: locked, kind: 1}, sendWriter{send: locked, kind: 2}
	}
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		keep := time.NewTicker(keepaliveEvery)
		defer keep.Stop()
		for {
			select {
			case <-actx.Done():
				return
			case <-keep.C:
				if locked(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}) != nil {
					cancel()
					return
				}
			}
		}
	}()
	p, err := pb.AttachProcess(actx, sc.key, skproc.Ref{PID: pid}, opts)
	cancel()
	wg.Wait()
	if ctx.Err() != nil {
		return f.connectErr(r, context.Cause(ctx))
	}
	if err != nil {
		return f.procErr(r, err)
	}
	if p.Running { // an attach ends with its process; one that did not is cut
		return connect.NewError(connect.CodeUnavailable, errors.New("the process's output stream was cut; connect to it again"))
	}
	return locked(processEnd(p))
}

// sendWriter turns output into data events sent on a stream.
type sendWriter struct {
	send func(*process.ProcessEvent) error
	kind int // 1 stdout, 2 stderr, 3 pty
}

func (w sendWriter) Write(b []byte) (int, error) {
	if err := w.send(dataEvent(w.kind, slices.Clone(b))); err != nil {
		return 0, err
	}
	return len(b), nil
}

func dataEvent(kind int, data []byte) *process.ProcessEvent {
	var d *process.ProcessEvent_DataEvent
	switch kind {
	case 1:
		d = &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: data}}
	case 2:
		d = &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: data}}
	default:
		d = &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Pty{Pty: data}}
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}
}

// processEnd is E2B's end event of an engine process.
func processEnd(p *skproc.Process) *process.ProcessEvent {
	end := &process.ProcessEvent_EndEvent{ExitCode: int32(p.ExitCode), Exited: true}
	switch {
	case p.StartError != "":
		msg := p.StartError
		end.Exited, end.Status, end.Error = false, "error", &msg
	case p.TimedOut:
		msg := "the command passed its deadline and was killed"
		end.Status, end.Error = "timeout", &msg
	case p.Signal != 0:
		end.Status = fmt.Sprintf("signal: %d", p.Signal)
	case p.Killed:
		end.Status = "killed"
	default:
		end.Status = fmt.Sprintf("exit status %d", p.ExitCode)
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}
}

// processInfo is an engine process as E2B lists it: the command the SDK asked for (argv's shim for /bin/bash
// undone), its tag and working directory.
func processInfo(p *skproc.Process) *process.ProcessInfo {
	cfg := &process.ProcessConfig{}
	argv := p.Argv
	if len(argv) >= 4 && argv[0] == "/bin/sh" && argv[1] == "-c" && argv[2] == bashShim && argv[3] == "sh" {
		cfg.Cmd, cfg.Args = "/bin/bash", argv[4:]
	} else if len(argv) > 0 {
		cfg.Cmd, cfg.Args = argv[0], argv[1:]
	}
	if p.Workdir != "" {
		wd := p.Workdir
		cfg.Cwd = &wd
	}
	info := &process.ProcessInfo{Config: cfg, Pid: uint32(p.PID)}
	if p.Tag != "" {
		tag := p.Tag
		info.Tag = &tag
	}
	return info
}

// engineRef is the engine's name of the selected process.
func engineRef(sel *process.ProcessSelector) (skproc.Ref, error) {
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if s.Pid > 0 && s.Pid <= 1<<31-1 {
			return skproc.Ref{PID: int(s.Pid)}, nil
		}
	case *process.ProcessSelector_Tag:
		if s.Tag != "" {
			return skproc.Ref{Tag: s.Tag}, nil
		}
	}
	return skproc.Ref{}, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %v not found", selectorString(sel)))
}

// running finds the running engine process sel names.
func running(ctx context.Context, sc *sandboxCtx, pb service.ProcessBackend, sel *process.ProcessSelector) (*skproc.Process, error) {
	ref, err := engineRef(sel)
	if err != nil {
		return nil, err
	}
	ps, err := pb.Processes(ctx, sc.key)
	if err != nil {
		return nil, err
	}
	for i := range ps {
		if ps[i].Running && (ref.PID != 0 && ps[i].PID == ref.PID || ref.PID == 0 && ps[i].Tag == ref.Tag) {
			return &ps[i], nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %v not found", selectorString(sel)))
}

// signal sends an E2B signal to an engine process: SIGKILL ends its whole tree (SIGTERM, the grace, SIGKILL)
// and returns once it ended; SIGTERM goes to its process group, which may handle it.
func signal(ctx context.Context, sc *sandboxCtx, pb service.ProcessBackend, ref skproc.Ref, sig process.Signal) error {
	switch sig {
	case process.Signal_SIGNAL_SIGTERM:
		return pb.SignalProcess(ctx, sc.key, ref, syscall.SIGTERM)
	case process.Signal_SIGNAL_SIGKILL:
		if err := pb.KillProcess(ctx, sc.key, ref); err != nil {
			return err
		}
		_, err := pb.AttachProcess(ctx, sc.key, ref, skproc.AttachOptions{}) // until it ended
		if fault.Is(err, fault.ProcessNotFound) || fault.Is(err, fault.ProcessExited) {
			return nil
		}
		return err
	}
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v is not supported: send SIGTERM or SIGKILL", sig))
}

var _ io.Writer = sendWriter{}
