package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/e2b/proto/process"
	"github.com/sandkeep/sandkeep/internal/e2b/proto/process/processconnect"
	"github.com/sandkeep/sandkeep/internal/service"
	skproc "github.com/sandkeep/sandkeep/processes"
)

// Bounds of the process service.
const (
	maxProcTimeout   = 24 * time.Hour
	procOutputLimit  = 64 << 20 // per stream, the engine's most
	subscriberQueue  = 4096     // events a slow reader may fall behind before it is cut off
	keepaliveEvery   = 30 * time.Second
	maxProcsPerFront = 4096
)

// proc is one command started through the process service where the engine has no processes: it runs on the
// engine's exec path, owned by the front (not by the request that started it), so a client that disconnects can
// connect to it again.
type proc struct {
	pid     uint32
	sandbox string
	info    *process.ProcessInfo
	cancel  context.CancelFunc
	resize  chan sandkeep.WindowSize // nil unless a PTY

	inMu  sync.Mutex
	stdin *io.PipeWriter // nil when the command reads /dev/null

	mu   sync.Mutex
	subs map[chan *process.ProcessEvent]struct{}
	end  *process.ProcessEvent // set once it ended
	done chan struct{}
}

// subscribe returns a channel of the process's events from now on (its end included); the channel is closed
// after the end event, or when the reader fell too far behind.
func (p *proc) subscribe() (chan *process.ProcessEvent, func()) {
	ch := make(chan *process.ProcessEvent, subscriberQueue)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		ch <- p.end
		close(ch)
		return ch, func() {}
	}
	if p.subs == nil {
		p.subs = map[chan *process.ProcessEvent]struct{}{}
	}
	p.subs[ch] = struct{}{}
	return ch, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if _, ok := p.subs[ch]; ok {
			delete(p.subs, ch)
			close(ch)
		}
	}
}

func (p *proc) publish(ev *process.ProcessEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ch := range p.subs {
		select {
		case ch <- ev:
		default: // too far behind: cut it off rather than hold up the command or grow without bound
			delete(p.subs, ch)
			close(ch)
		}
	}
}

func (p *proc) finish(ev *process.ProcessEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.end = ev
	for ch := range p.subs {
		select {
		case ch <- ev:
		default:
		}
		close(ch)
	}
	p.subs = nil
	close(p.done)
}

// eventWriter turns a stream of output into data events.
type eventWriter struct {
	p    *proc
	kind int // 1 stdout, 2 stderr, 3 pty
}

func (w eventWriter) Write(b []byte) (int, error) {
	data := slices.Clone(b)
	var d *process.ProcessEvent_DataEvent
	switch w.kind {
	case 1:
		d = &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: data}}
	case 2:
		d = &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: data}}
	default:
		d = &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Pty{Pty: data}}
	}
	w.p.publish(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}})
	return len(b), nil
}

// processes are the front's running commands, by pid.
type processes struct {
	mu   sync.Mutex
	next uint32
	byID map[uint32]*proc
	wg   sync.WaitGroup // one per running command's goroutine
}

func newProcesses() *processes { return &processes{next: 1000, byID: map[uint32]*proc{}} }

func (ps *processes) add(p *proc) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if len(ps.byID) >= maxProcsPerFront {
		return connect.NewError(connect.CodeResourceExhausted, errors.New("too many running commands on this server"))
	}
	ps.next++
	p.pid = ps.next
	p.info.Pid = p.pid
	ps.byID[p.pid] = p
	return nil
}

func (ps *processes) remove(pid uint32) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	delete(ps.byID, pid)
}

// of returns the sandbox's processes, by pid.
func (ps *processes) of(sandbox string) []*proc {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []*proc
	for _, p := range ps.byID {
		if p.sandbox == sandbox {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

// find selects a process of the sandbox by pid or tag; another sandbox's pid is not found.
func (ps *processes) find(sandbox string, sel *process.ProcessSelector) (*proc, error) {
	for _, p := range ps.of(sandbox) {
		switch s := sel.GetSelector().(type) {
		case *process.ProcessSelector_Pid:
			if p.pid == s.Pid {
				return p, nil
			}
		case *process.ProcessSelector_Tag:
			if p.info.Tag != nil && *p.info.Tag == s.Tag {
				return p, nil
			}
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %v not found", selectorString(sel)))
}

func selectorString(sel *process.ProcessSelector) string {
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		return fmt.Sprintf("with pid %d", s.Pid)
	case *process.ProcessSelector_Tag:
		return fmt.Sprintf("with tag %q", s.Tag)
	}
	return "(no selector)"
}

// endAll cancels the sandbox's processes (kill, pause) and waits for them to end.
func (ps *processes) endAll(sandbox string) {
	for _, p := range ps.of(sandbox) {
		p.cancel()
		<-p.done
	}
}

// processService is envd's process.Process on the engine's exec path.
type processService struct {
	f *Front
}

var _ processconnect.ProcessHandler = (*processService)(nil)

// bashShim runs /bin/bash where the image has it, else /bin/sh without bash's -l.
const bashShim = `if [ -x /bin/bash ]; then exec /bin/bash "$@"; fi; [ "$1" = -l ] && shift; exec /bin/sh "$@"`

// argv is the command the SDK asks for, as it will run: commands.run sends /bin/bash -l -c CMD; an image
// without bash runs it with /bin/sh -c (docs/E2B.md).
func argv(cfg *process.ProcessConfig) []string {
	if cfg.GetCmd() == "/bin/bash" {
		return append([]string{"/bin/sh", "-c", bashShim, "sh"}, cfg.GetArgs()...)
	}
	return append([]string{cfg.GetCmd()}, cfg.GetArgs()...)
}

func (s *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	sc, r, err := s.f.rpcSandbox(ctx)
	if err != nil {
		return err
	}
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is empty"))
	}
	workdir := "/workspace"
	if cfg.Cwd != nil {
		rl, err := rel(cfg.GetCwd())
		if err != nil {
			return s.f.connectErr(r, err)
		}
		workdir = inSandbox(rl)
	}
	// A command lasts until the call's deadline (the SDK's timeoutMs; 0 sends none) and never past its
	// sandbox's end, when the sweeper kills the sandbox anyway.
	timeout := min(maxProcTimeout, time.Until(sc.rec.EndAt))
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	timeout = max(timeout, time.Second)
	p := &proc{sandbox: sc.rec.ID, done: make(chan struct{}),
		info: &process.ProcessInfo{Config: cfg, Tag: req.Msg.Tag}}
	env := map[string]string{"HOME": "/workspace", "USER": "user"}
	for k, v := range cfg.GetEnvs() {
		env[k] = v
	}
	// Every command is one of the engine's processes where the engine has them, carrying the sandbox's network
	// block (its create's, or its last update's) to the start's admission as an exec carries its own: the
	// template's network narrowed by it, each process a session of the sandbox's egress proxy of its own for its
	// whole life, beside the others.
	if pb, ok := s.f.engineProcs(sc.b); ok {
		lifetime := timeout
		if _, ok := ctx.Deadline(); ok {
			lifetime += lifetimeSlack
		}
		sreq := startRequest(sc, req.Msg, argv(cfg), workdir, envList(sc.rec.Env, env), lifetime, s.f.requestID(r))
		block, started, err := s.f.startNetwork(sc.rec.ID)
		if err != nil {
			return s.f.connectErr(r, err)
		}
		sreq.Network = block
		p, err := pb.StartProcess(ctx, sc.key, sreq)
		started()
		if err == nil {
			if err := stream.Send(&process.StartResponse{Event: startEvent(uint32(p.PID))}); err != nil {
				return err
			}
			send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
			if !p.Running { // it could not start (not found, not executable): its exit says why
				return send(processEnd(p))
			}
			return s.f.streamProcess(ctx, r, sc, pb, p.PID, sreq.TTY != nil, true, send)
		}
		if !s.f.noProcesses(ctx, sc, pb, err) {
			return s.f.connectErr(r, err)
		}
	}
	// Where the engine has no processes (the exec transport without a relay), each command is the front's own,
	// on the exec path, which carries the sandbox's network block to admission too. Concurrent: E2B runs a
	// sandbox's commands at once; the engine runs them one at a time there all the same (docs/E2B.md).
	ereq := sandkeep.ExecRequest{Argv: argv(cfg), Workdir: workdir, Env: envList(sc.rec.Env, env), Timeout: timeout,
		OutputLimit: procOutputLimit, Concurrent: true}
	ar := service.AdmitRequest{Template: sc.rec.OpTemplate, RequestID: s.f.requestID(r)}
	var stdinR *io.PipeReader
	if req.Msg.GetStdin() || req.Msg.Pty != nil {
		stdinR, p.stdin = io.Pipe()
		ereq.Stdin = stdinR
	}
	if pty := req.Msg.Pty; pty != nil {
		p.resize = make(chan sandkeep.WindowSize, 8)
		ereq.TTY = &sandkeep.TTY{Size: size(pty), Resize: p.resize}
		ereq.Stdout = eventWriter{p: p, kind: 3}
	} else {
		ereq.Stdout, ereq.Stderr = eventWriter{p: p, kind: 1}, eventWriter{p: p, kind: 2}
	}
	// The command belongs to the front, not to this request: it keeps running when the client goes away, and
	// ends at its deadline, on a kill signal, or when its sandbox is killed or paused.
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = cancel
	// The network is read with the command's entry made, under the lock a network update holds while it looks
	// for running commands: a command runs with the network before an update or after it, never between.
	s.f.netMu.Lock()
	cur, err := s.f.recs.get(sc.rec.ID)
	if err == nil {
		err = s.f.procs.add(p)
	}
	s.f.netMu.Unlock()
	if err != nil {
		cancel()
		return s.f.connectErr(r, err)
	}
	ar.Network = cur.network()
	evs, unsubscribe := p.subscribe()
	defer unsubscribe()
	started := make(chan struct{})
	var once sync.Once
	ar.Observer.Started = func() { once.Do(func() { close(started) }) }
	failed := make(chan error, 1)
	s.f.procs.wg.Add(1)
	go func() {
		defer s.f.procs.wg.Done()
		defer s.f.procs.remove(p.pid)
		defer cancel()
		res, err := sc.b.Exec(pctx, sc.key, ar, ereq)
		if stdinR != nil {
			stdinR.CloseWithError(io.ErrClosedPipe)
		}
		if err != nil {
			failed <- err // a refusal before the start answers Start; after it, the end event says it
		} else {
			once.Do(func() { close(started) }) // a command that ran is started, whatever its events said
		}
		p.finish(endEvent(res, err))
	}()
	select {
	case <-started:
	case err := <-failed:
		select {
		case <-started: // it started, then failed: the stream tells the client (start, then the end event)
		default:
			return s.f.connectErr(r, err)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := stream.Send(&process.StartResponse{Event: startEvent(p.pid)}); err != nil {
		return err
	}
	return relay(ctx, evs, func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) })
}

func (f *Front) requestID(r *http.Request) string {
	_, hooks := f.backend()
	if r == nil || hooks.RequestID == nil {
		return ""
	}
	return hooks.RequestID(r)
}

func size(pty *process.PTY) sandkeep.WindowSize {
	return sandkeep.WindowSize{Rows: uint16(pty.GetSize().GetRows()), Cols: uint16(pty.GetSize().GetCols())}
}

func startEvent(pid uint32) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}
}

// endEvent is E2B's end of a process: its exit code, or the error that ended it.
func endEvent(res *sandkeep.ExecResult, err error) *process.ProcessEvent {
	end := &process.ProcessEvent_EndEvent{}
	switch {
	case err != nil:
		msg := err.Error()
		end.ExitCode, end.Status, end.Error = -1, "error", &msg
	case res.TimedOut:
		msg := "the command passed its deadline and was killed"
		end.ExitCode, end.Exited, end.Status, end.Error = int32(res.ExitCode), true, "timeout", &msg
	case res.ExitCode > 128:
		end.ExitCode, end.Exited, end.Status = int32(res.ExitCode), true, fmt.Sprintf("signal: %d", res.ExitCode-128)
	default:
		end.ExitCode, end.Exited, end.Status = int32(res.ExitCode), true, fmt.Sprintf("exit status %d", res.ExitCode)
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}
}

// relay sends events until the end event (sent too), the reader falling behind, or ctx ending; keepalives
// keep idle streams open through proxies.
func relay(ctx context.Context, evs <-chan *process.ProcessEvent, send func(*process.ProcessEvent) error) error {
	keep := time.NewTicker(keepaliveEvery)
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-keep.C:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case ev, ok := <-evs:
			if !ok {
				return connect.NewError(connect.CodeResourceExhausted, errors.New("the reader fell too far behind the command's output"))
			}
			if err := send(ev); err != nil {
				return err
			}
			if ev.GetEnd() != nil {
				return nil
			}
		}
	}
}

func (s *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	sc, r, err := s.f.rpcSandbox(ctx)
	if err != nil {
		return err
	}
	p, err := s.f.procs.find(sc.rec.ID, req.Msg.GetProcess())
	if err != nil {
		pb, ok := s.f.engineProcs(sc.b)
		if !ok {
			return err
		}
		ep, err := running(ctx, sc, pb, req.Msg.GetProcess())
		if err != nil {
			return s.f.procErr(r, err)
		}
		if err := stream.Send(&process.ConnectResponse{Event: startEvent(uint32(ep.PID))}); err != nil {
			return err
		}
		// Output from now on, as envd's Connect sends it (`sandkeep proc logs` reads the ring).
		return s.f.streamProcess(ctx, r, sc, pb, ep.PID, ep.TTY, false,
			func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) })
	}
	evs, unsubscribe := p.subscribe()
	defer unsubscribe()
	if err := stream.Send(&process.ConnectResponse{Event: startEvent(p.pid)}); err != nil {
		return err
	}
	return relay(ctx, evs, func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) })
}

func (s *processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	sc, r, err := s.f.rpcSandbox(ctx)
	if err != nil {
		return nil, err
	}
	out := &process.ListResponse{}
	for _, p := range s.f.procs.of(sc.rec.ID) {
		out.Processes = append(out.Processes, p.info)
	}
	if pb, ok := s.f.engineProcs(sc.b); ok {
		ps, err := pb.Processes(ctx, sc.key)
		if err != nil && !s.f.unavailable(err) {
			return nil, s.f.connectErr(r, err)
		}
		for i := range ps {
			if ps[i].Running { // the engine keeps a few ended ones too; E2B lists what runs
				out.Processes = append(out.Processes, processInfo(&ps[i]))
			}
		}
	}
	return connect.NewResponse(out), nil
}

// target is the process a control call selects: one of the front's own commands (the exec path) or one of the
// engine's processes.
type target struct {
	own *proc
	sc  *sandboxCtx
	r   *http.Request
	pb  service.ProcessBackend
	ref skproc.Ref
}

// selected finds the process sel names in the caller's sandbox; another sandbox's pid is not found.
func (s *processService) selected(ctx context.Context, sel *process.ProcessSelector) (*target, error) {
	sc, r, err := s.f.rpcSandbox(ctx)
	if err != nil {
		return nil, err
	}
	p, err := s.f.procs.find(sc.rec.ID, sel)
	if err == nil {
		return &target{own: p, sc: sc, r: r}, nil
	}
	pb, ok := s.f.engineProcs(sc.b)
	if !ok {
		return nil, err
	}
	ref, err := engineRef(sel)
	if err != nil {
		return nil, err
	}
	return &target{sc: sc, r: r, pb: pb, ref: ref}, nil
}

func (s *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	t, err := s.selected(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty != nil {
		if t.own == nil {
			if err := t.pb.ResizeProcess(ctx, t.sc.key, t.ref, size(req.Msg.Pty)); err != nil {
				return nil, s.f.procErr(t.r, err)
			}
			return connect.NewResponse(&process.UpdateResponse{}), nil
		}
		p := t.own
		if p.resize == nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has no PTY"))
		}
		select {
		case p.resize <- size(req.Msg.Pty):
		case <-p.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

// write sends input to the process's stdin (or its terminal).
func (p *proc) write(ctx context.Context, in *process.ProcessInput) error {
	data := in.GetStdin()
	if in.GetPty() != nil {
		data = in.GetPty()
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.stdin == nil {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("the process was started without stdin"))
	}
	done := make(chan error, 1)
	go func() { _, err := p.stdin.Write(data); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("stdin is closed: %w", err))
		}
		return nil
	case <-p.done:
		return connect.NewError(connect.CodeNotFound, errors.New("the process ended"))
	case <-ctx.Done():
		p.stdin.CloseWithError(ctx.Err()) // unblocks the writer goroutine
		<-done
		return ctx.Err()
	}
}

// input sends in to the target's stdin (or its terminal).
func (s *processService) input(ctx context.Context, t *target, in *process.ProcessInput) error {
	if t.own != nil {
		return t.own.write(ctx, in)
	}
	data := in.GetStdin()
	if in.GetPty() != nil {
		data = in.GetPty()
	}
	if err := t.pb.SendInput(ctx, t.sc.key, t.ref, data); err != nil {
		return s.f.procErr(t.r, err)
	}
	return nil
}

func (s *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	t, err := s.selected(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := s.input(ctx, t, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (s *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	var t *target
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			var err error
			if t, err = s.selected(ctx, ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *process.StreamInputRequest_Data:
			if t == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("send the start event first"))
			}
			if err := s.input(ctx, t, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	t, err := s.selected(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if t.own == nil {
		if err := t.pb.CloseStdin(ctx, t.sc.key, t.ref); err != nil {
			return nil, s.f.procErr(t.r, err)
		}
		return connect.NewResponse(&process.CloseStdinResponse{}), nil
	}
	p := t.own
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.stdin == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the process was started without stdin"))
	}
	p.stdin.Close()
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

// SendSignal signals the process. On the engine, SIGKILL ends its whole tree and SIGTERM goes to its process
// group (signal); on the exec path both cancel the command, which the agent ends with SIGTERM, a grace, then
// SIGKILL.
func (s *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	t, err := s.selected(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if t.own == nil {
		if err := signal(ctx, t.sc, t.pb, t.ref, req.Msg.GetSignal()); err != nil {
			return nil, s.f.procErr(t.r, err)
		}
		return connect.NewResponse(&process.SendSignalResponse{}), nil
	}
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL, process.Signal_SIGNAL_SIGTERM:
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v is not supported: send SIGTERM or SIGKILL", req.Msg.GetSignal()))
	}
	p := t.own
	p.cancel()
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}
