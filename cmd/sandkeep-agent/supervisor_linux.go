package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// A supervisor is a child `sandkeep-agent serve` that runs one command for this agent: a command the host runs
// beside others (Request.Concurrent) or a process (Request.Detach). It is a subreaper of its own, so the orphans
// of its command reparent to it, not to this agent: its tree is told apart from every other command's and
// killed alone, with the same deadline, grace, tree kill and exit status as any command (command_linux.go).
// This agent speaks the same frames to it over a pair of pipes: for a concurrent command it relays them both
// ways; for a process it keeps what comes back (process_linux.go). Where no process but PID 1 may be a subreaper
// (gVisor), the supervisor's orphans go to PID 1 and carry its mark instead, by which its tree still takes them
// and only them (tree_linux.go).
type supervisor struct {
	id     uint32 // the command's ID, as the host and the supervisor know it
	pid    int
	status <-chan syscall.WaitStatus
	fw     *agentproto.FrameWriter // to the supervisor's stdin
	in     *os.File
	out    *os.File      // the supervisor's stdout: its frames
	exited chan struct{} // closed once its status arrived
}

// supervisors are this agent's supervisor children.
type supervisors struct {
	mu    sync.Mutex // held across a spawn and its registration, so the tree never takes a new one for its own
	byPID map[int]*supervisor
	byID  map[uint32]*supervisor // the concurrent commands, by command ID
	n     atomic.Int32
	wg    sync.WaitGroup // their relay goroutines
}

func newSupervisors() *supervisors {
	return &supervisors{byPID: map[int]*supervisor{}, byID: map[uint32]*supervisor{}}
}

// has reports whether pid is a supervisor. It takes the lock even when there are none: a spawn holds it until
// its child is registered, so a tree walk never takes a supervisor being born for a member of its own tree.
func (s *supervisors) has(pid int) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.byPID[pid]
	return ok
}

func (s *supervisors) count() int {
	if s == nil {
		return 0
	}
	return int(s.n.Load())
}

func (s *supervisors) command(id uint32) *supervisor {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[id]
}

// errNoMark: without a subreaper (gVisor) a supervisor's orphans reparent to PID 1, where only its mark tells
// whose they are; a supervisor that could not set one refuses its command.
var errNoMark = errors.New("concurrent commands and processes need a subreaper or a mark on their tree, and this supervisor has neither")

// spawn starts a supervisor for req (sent to it as is) and registers it; concurrent registers it by ID too.
func (s *server) spawn(req agentproto.Request, concurrent bool) (*supervisor, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	sv := &supervisor{id: req.ID, in: inW, out: outR, fw: agentproto.NewFrameWriter(inW), exited: make(chan struct{})}
	s.sup.mu.Lock()
	pid, status, err := s.reaper.start(func() (int, error) {
		p, err := os.StartProcess(selfExe(), []string{"sandkeep-agent", "serve"}, &os.ProcAttr{
			Files: []*os.File{inR, outW, os.Stderr},
			Sys:   &syscall.SysProcAttr{Setpgid: true},
		})
		if err != nil {
			return 0, err
		}
		pid := p.Pid
		_ = p.Release() // clears p.Pid
		return pid, nil
	})
	if err == nil {
		sv.pid, sv.status = pid, status
		s.sup.byPID[pid] = sv
		if concurrent {
			s.sup.byID[req.ID] = sv
		}
		s.sup.n.Store(int32(len(s.sup.byPID)))
	}
	s.sup.mu.Unlock()
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, err
	}
	go func() { <-status; close(sv.exited) }() // ends with the supervisor, which never outlives this agent's stop
	if err := sv.fw.WriteFrame(agentproto.FrameRequest, req.ID, body); err != nil {
		s.log.Printf("supervisor %d: send request: %v", pid, err)
	}
	return sv, nil
}

// drop forgets sv once it has exited.
func (s *server) drop(sv *supervisor) {
	<-sv.exited
	sv.in.Close()
	sv.out.Close()
	s.sup.mu.Lock()
	delete(s.sup.byPID, sv.pid)
	if s.sup.byID[sv.id] == sv {
		delete(s.sup.byID, sv.id)
	}
	s.sup.n.Store(int32(len(s.sup.byPID)))
	s.sup.mu.Unlock()
}

// startConcurrent runs req under a supervisor and relays its frames to the host until its report, which ends it.
func (s *server) startConcurrent(req agentproto.Request) {
	req.Concurrent = false
	sv, err := s.spawn(req, true)
	if err != nil {
		s.report(agentproto.Result{ID: req.ID, ExitCode: 126, StartError: err.Error()})
		return
	}
	s.sup.wg.Add(1)
	go func() {
		defer s.sup.wg.Done()
		defer s.drop(sv)
		var buf []byte
		for {
			f, err := agentproto.ReadFrame(sv.out, &buf)
			if err != nil {
				// The supervisor died before its report (killed from inside): the host learns it as a broken command.
				s.report(agentproto.Result{ID: req.ID, ExitCode: 126, StartError: fmt.Sprintf("supervisor ended: %v", err)})
				sv.in.Close()
				return
			}
			switch f.Type {
			case agentproto.FrameAccepted:
				continue // this agent accepted the request already
			case agentproto.FrameStdout, agentproto.FrameStderr:
				_ = s.fw.WriteFrame(f.Type, req.ID, f.Payload)
			case agentproto.FrameResult:
				_ = s.fw.WriteFrame(f.Type, req.ID, f.Payload)
				sv.in.Close() // an idle supervisor exits on EOF
				return
			}
		}
	}()
}

// relay passes a host frame for a concurrent command on to its supervisor; false when id is not one.
func (s *server) relay(f agentproto.Frame) bool {
	sv := s.sup.command(f.ID)
	if sv == nil {
		return false
	}
	// A supervisor that stopped reading is dead or dying: never let it hold the channel up.
	_ = sv.in.SetWriteDeadline(time.Now().Add(time.Second))
	_ = sv.fw.WriteFrame(f.Type, f.ID, f.Payload)
	return true
}

// stopSupervisors ends every supervisor (each kills its command's tree, as on a stdin EOF) and waits for them.
func (s *server) stopSupervisors() {
	s.sup.mu.Lock()
	all := make([]*supervisor, 0, len(s.sup.byPID))
	for _, sv := range s.sup.byPID {
		all = append(all, sv)
	}
	s.sup.mu.Unlock()
	for _, sv := range all {
		sv.in.Close()
	}
	for _, sv := range all {
		<-sv.exited
	}
	s.sup.wg.Wait()
}
