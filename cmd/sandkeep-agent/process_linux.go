package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// A process is a command that outlives its request (Request.Detach): it runs under a supervisor, and this agent
// keeps its output in a ring buffer per stream, its exit once it ends, and answers the host's process operations
// about it. It dies with its tree at its lifetime bound (the request's deadline, enforced by its supervisor),
// on OpKill, and when this agent stops (the channel ends: the host went away, the sandbox stops or recycles).
type process struct {
	info agentproto.ProcessInfo // the fixed part: pid, tag, argv, workdir, tty, started
	sv   *supervisor
	inMu sync.Mutex // one input write at a time, whole

	mu        sync.Mutex // guards the rest
	out, errs *ring
	stdinOpen bool
	exit      *agentproto.Result
	changed   chan struct{} // closed and replaced on new output and at the exit
}

func (p *process) broadcast() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// snapshot is p's ProcessInfo now.
func (p *process) snapshot() agentproto.ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	in := p.info
	in.Running = p.exit == nil
	in.Stdin = p.stdinOpen && p.exit == nil
	in.Exit = p.exit
	return in
}

// processes is the agent's process table.
type processes struct {
	mu       sync.Mutex
	all      []*process               // in start order; at most MaxProcesses
	attaches map[uint32]chan struct{} // attach operation ID -> closed to cancel it
}

func newProcesses() *processes { return &processes{attaches: map[uint32]chan struct{}{}} }

// admit makes room for one more process: it forgets the oldest exited ones past the bound, and refuses when
// MaxProcesses run, or when a running process has the same tag.
func (t *processes) admit(tag string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	running := 0
	for _, p := range t.all {
		in := p.snapshot()
		if in.Running {
			running++
			if tag != "" && in.Tag == tag {
				return fmt.Errorf("a running process already has the tag %q", tag)
			}
		}
	}
	if running >= agentproto.MaxProcesses {
		return fmt.Errorf("%d processes run already, the most a sandbox keeps", running)
	}
	for len(t.all) >= agentproto.MaxProcesses {
		i := slices.IndexFunc(t.all, func(p *process) bool { return !p.snapshot().Running })
		t.all = slices.Delete(t.all, i, i+1)
	}
	return nil
}

func (t *processes) add(p *process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.all = slices.DeleteFunc(t.all, func(q *process) bool { return q.info.PID == p.info.PID }) // a reused pid
	t.all = append(t.all, p)
}

// find returns the process with pid, or else the newest with tag (a running one first).
func (t *processes) find(pid int, tag string) *process {
	t.mu.Lock()
	defer t.mu.Unlock()
	var found *process
	for _, p := range slices.Backward(t.all) {
		switch {
		case pid != 0:
			if p.info.PID == pid {
				return p
			}
		case p.info.Tag == tag:
			if p.snapshot().Running {
				return p
			}
			if found == nil {
				found = p
			}
		}
	}
	return found
}

func (t *processes) list() []agentproto.ProcessInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]agentproto.ProcessInfo, 0, len(t.all))
	for _, p := range t.all {
		out = append(out, p.snapshot())
	}
	return out
}

// startProcess starts req's command as a process and answers the request as soon as it runs (its pid) or
// could not start (the command's own report).
func (s *server) startProcess(req agentproto.Request) {
	if err := s.procs.admit(req.Detach.Tag); err != nil {
		s.report(agentproto.Result{ID: req.ID, ExitCode: 126, StartError: err.Error()})
		return
	}
	ring := int(req.Detach.Ring)
	if ring == 0 {
		ring = agentproto.DefaultRing
	}
	child := req
	child.Detach, child.Concurrent = nil, false
	child.Bounded, child.Started = true, true
	child.StdoutLimit, child.StderrLimit = agentproto.MaxStreamLimit, agentproto.MaxStreamLimit
	sv, err := s.spawn(child, false)
	if err != nil {
		s.report(agentproto.Result{ID: req.ID, ExitCode: 126, StartError: err.Error()})
		return
	}
	p := &process{
		info: agentproto.ProcessInfo{Tag: req.Detach.Tag, Argv: agentproto.ClipArgv(req.Argv), Workdir: req.Workdir,
			TTY: req.TTY != nil},
		sv: sv, out: newRing(ring), errs: newRing(ring), stdinOpen: req.Stdin, changed: make(chan struct{}),
	}
	s.sup.wg.Add(1)
	go func() {
		defer s.sup.wg.Done()
		defer s.drop(sv)
		s.superviseProcess(req.ID, p)
	}()
}

// maxEarlyStderr bounds what a process's supervisor may say before the process runs (why it could not start).
const maxEarlyStderr = 64 << 10

// superviseProcess reads p's supervisor until it reports: first the start (or why there was none), which
// answers the host's request, then the output into the rings, then the exit.
func (s *server) superviseProcess(id uint32, p *process) {
	var early []byte
	started := false
	var buf []byte
	for {
		f, err := agentproto.ReadFrame(p.sv.out, &buf)
		if err != nil {
			res := agentproto.Result{ID: id, ExitCode: 126, StartError: fmt.Sprintf("the process's supervisor ended: %v", err)}
			if !started {
				s.report(res)
			} else {
				s.ended(p, res)
			}
			p.sv.in.Close()
			return
		}
		switch f.Type {
		case agentproto.FrameStarted:
			pid, err := agentproto.DecodePID(f.Payload)
			if err != nil || started {
				continue
			}
			started = true
			p.info.PID = pid
			p.info.StartedMS = time.Now().UnixMilli()
			s.procs.add(p)
			s.report(agentproto.Result{ID: id, PID: pid})
		case agentproto.FrameStdout, agentproto.FrameStderr:
			if !started {
				if len(early)+len(f.Payload) <= maxEarlyStderr {
					early = append(early, f.Payload...)
				}
				continue
			}
			p.mu.Lock()
			if f.Type == agentproto.FrameStdout {
				p.out.write(f.Payload)
			} else {
				p.errs.write(f.Payload)
			}
			p.broadcast()
			p.mu.Unlock()
		case agentproto.FrameResult:
			res, err := agentproto.DecodeResult(f.Payload, id)
			if err != nil {
				res = agentproto.Result{ID: id, ExitCode: 126, StartError: err.Error()}
			}
			if !started {
				if len(early) > 0 {
					_ = s.fw.WriteFrame(agentproto.FrameStderr, id, early)
				}
				s.report(res)
			} else {
				s.ended(p, res)
			}
			p.sv.in.Close() // an idle supervisor exits on EOF
			return
		}
	}
}

// ended records p's exit and wakes its attachers.
func (s *server) ended(p *process, res agentproto.Result) {
	res.PID = p.info.PID
	p.mu.Lock()
	p.exit = &res
	p.broadcast()
	p.mu.Unlock()
}

// processOp answers one process operation; an attach streams until its end, in a goroutine of its own.
func (s *server) processOp(f agentproto.Frame) {
	op, err := agentproto.DecodeProcessOp(f.Payload, f.ID)
	if err != nil {
		s.reply(agentproto.ProcessReply{ID: f.ID, Code: agentproto.ReplyInvalid, Error: err.Error()})
		return
	}
	if op.Op == agentproto.OpList {
		s.reply(agentproto.ProcessReply{ID: op.ID, Processes: s.procs.list()})
		return
	}
	p := s.procs.find(op.PID, op.Tag)
	if p == nil {
		what := fmt.Sprintf("pid %d", op.PID)
		if op.PID == 0 {
			what = fmt.Sprintf("tag %q", op.Tag)
		}
		s.reply(agentproto.ProcessReply{ID: op.ID, Code: agentproto.ReplyNotFound, Error: "no process with " + what})
		return
	}
	if op.Op == agentproto.OpAttach {
		cancel := make(chan struct{})
		s.procs.mu.Lock()
		s.procs.attaches[op.ID] = cancel
		s.procs.mu.Unlock()
		s.sup.wg.Add(1)
		go func() {
			defer s.sup.wg.Done()
			s.attach(op, p, cancel)
			s.procs.mu.Lock()
			delete(s.procs.attaches, op.ID)
			s.procs.mu.Unlock()
		}()
		return
	}
	s.sup.wg.Add(1)
	go func() { // input may wait for the process to read; nothing else does, but all of them write to its supervisor
		defer s.sup.wg.Done()
		s.reply(s.control(op, p))
	}()
}

// control applies input, close_stdin, signal, resize or kill to p.
func (s *server) control(op agentproto.ProcessOp, p *process) agentproto.ProcessReply {
	rep := agentproto.ProcessReply{ID: op.ID}
	in := p.snapshot()
	fail := func(code, format string, a ...any) agentproto.ProcessReply {
		rep.Code, rep.Error = code, fmt.Sprintf(format, a...)
		return rep
	}
	if !in.Running {
		return fail(agentproto.ReplyExited, "process %d has exited", in.PID)
	}
	var t agentproto.FrameType
	var payload []byte
	switch op.Op {
	case agentproto.OpInput, agentproto.OpCloseStdin:
		if !in.Stdin {
			return fail(agentproto.ReplyInvalid, "process %d has no open stdin", in.PID)
		}
		t, payload = agentproto.FrameStdin, op.Data
		if op.Op == agentproto.OpCloseStdin {
			t, payload = agentproto.FrameStdinEOF, nil
		}
	case agentproto.OpSignal:
		t, payload = agentproto.FrameSignal, []byte{byte(op.Signal)}
	case agentproto.OpResize:
		if !in.TTY {
			return fail(agentproto.ReplyInvalid, "process %d has no terminal", in.PID)
		}
		t, payload = agentproto.FrameResize, agentproto.EncodeWindowSize(*op.Size)
	case agentproto.OpKill:
		t = agentproto.FrameCancel
	}
	if t == agentproto.FrameStdin && len(payload) == 0 {
		return rep
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	// A process that does not read its stdin fills the pipe: the write then fails after a while rather than
	// holding anything of the agent.
	_ = p.sv.in.SetWriteDeadline(time.Now().Add(inputWait))
	if err := p.sv.fw.WriteFrame(t, p.sv.id, payload); err != nil {
		if !p.snapshot().Running {
			return fail(agentproto.ReplyExited, "process %d has exited", in.PID)
		}
		return fail(agentproto.ReplyInvalid, "process %d: %s not delivered: %v", in.PID, op.Op, err)
	}
	if op.Op == agentproto.OpCloseStdin {
		p.mu.Lock()
		p.stdinOpen = false
		p.mu.Unlock()
	}
	return rep
}

// inputWait bounds a write to a process's supervisor (its stdin pipe full: the process does not read).
const inputWait = 5 * time.Second

// attach streams p's output to the host under op's ID: the ring's bytes first when asked, then what comes,
// until p ends (the reply carries its exit) or the host cancels (Detached).
func (s *server) attach(op agentproto.ProcessOp, p *process, cancel <-chan struct{}) {
	p.mu.Lock()
	offs := [2]int64{p.out.total, p.errs.total}
	if op.Replay || op.Snapshot {
		offs = [2]int64{}
	}
	p.mu.Unlock()
	var dropped [2]int64
	for {
		p.mu.Lock()
		var chunks [2][]byte
		more := false
		if !op.Quiet {
			for i, r := range []*ring{p.out, p.errs} {
				var d int64
				chunks[i], offs[i], d = r.since(offs[i], outputChunk)
				dropped[i] += d
				more = more || offs[i] < r.total
			}
		}
		exit, changed := p.exit, p.changed
		p.mu.Unlock()
		for i, t := range []agentproto.FrameType{agentproto.FrameStdout, agentproto.FrameStderr} {
			if len(chunks[i]) > 0 {
				if err := s.fw.WriteFrame(t, op.ID, chunks[i]); err != nil {
					return // the host is gone
				}
			}
		}
		if more {
			continue
		}
		if exit == nil && op.Snapshot {
			in := p.snapshot()
			in.StdoutDropped, in.StderrDropped = dropped[0], dropped[1]
			s.reply(agentproto.ProcessReply{ID: op.ID, Processes: []agentproto.ProcessInfo{in}, Detached: true})
			return
		}
		if exit != nil {
			in := p.snapshot()
			in.StdoutDropped, in.StderrDropped = dropped[0], dropped[1]
			s.reply(agentproto.ProcessReply{ID: op.ID, Processes: []agentproto.ProcessInfo{in}})
			return
		}
		select {
		case <-changed:
		case <-cancel:
			in := p.snapshot()
			in.StdoutDropped, in.StderrDropped = dropped[0], dropped[1]
			s.reply(agentproto.ProcessReply{ID: op.ID, Processes: []agentproto.ProcessInfo{in}, Detached: true})
			return
		}
	}
}

// cancelAttach ends the attach with id; false when there is none.
func (s *server) cancelAttach(id uint32) bool {
	s.procs.mu.Lock()
	defer s.procs.mu.Unlock()
	c, ok := s.procs.attaches[id]
	if ok {
		delete(s.procs.attaches, id)
		close(c)
	}
	return ok
}

// reply sends one operation's reply.
func (s *server) reply(rep agentproto.ProcessReply) {
	body, err := json.Marshal(rep)
	if err == nil {
		err = s.fw.WriteFrame(agentproto.FrameProcessReply, rep.ID, body)
	}
	if err != nil {
		s.log.Printf("reply to process op %d: %v", rep.ID, err)
	}
}

// signalOf is the signal in a FrameSignal payload.
func signalOf(p []byte) (syscall.Signal, error) {
	if len(p) != 1 || p[0] == 0 || p[0] > 64 {
		return 0, fmt.Errorf("%w: signal payload %v", agentproto.ErrProtocol, p)
	}
	return syscall.Signal(p[0]), nil
}
