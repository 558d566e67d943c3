package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// server reads the host's frames and runs one command at a time itself; concurrent commands and processes run
// under supervisors of their own (supervisor_linux.go, process_linux.go) beside it.
type server struct {
	fw     *agentproto.FrameWriter // stdout; shared by the running command's output pumps and its report
	log    *log.Logger             // stderr
	cur    *command                // the last command started; nil before the first
	tree   tree                    // the processes a command may leave behind (tree_linux.go)
	fwd    *forwarder              // port forwarding streams (forward_linux.go); nil before the first
	reaper *reaper                 // collects every child (reaper_linux.go)
	sup    *supervisors
	procs  *processes
}

// serve speaks the wire on in/out until in ends. It returns the process exit code: 0 on a clean end of stream
// while idle (a command still running is killed first), 1 on a broken stream.
func serve(in io.Reader, out io.Writer) int {
	s := &server{fw: agentproto.NewFrameWriter(out), log: log.New(os.Stderr, "sandkeep-agent: ", 0),
		reaper: newReaper(), sup: newSupervisors(), procs: newProcesses()}
	// gVisor refuses a subreaper (EINVAL): its commands' orphans go to PID 1, and the tree then finds them
	// there, a supervisor's by its mark (tree_linux.go).
	s.tree = newTree(setSubreaper() == nil, s.reaper, s.sup)
	if s.tree.markErr != nil {
		s.log.Printf("set the supervisor's mark: %v", s.tree.markErr)
	}
	// A host that went away must give a write error, not kill the agent (and orphan the tree) with SIGPIPE.
	// Notify rather than Ignore: an ignored signal would stay ignored in the commands.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)

	var buf []byte
	for {
		f, err := agentproto.ReadFrame(in, &buf)
		if err != nil {
			s.end()
			if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
				// A reset is the host closing its end with frames of ours still unread (a report, forwarded
				// bytes): it left, as with EOF, and broke nothing.
				return 0
			}
			s.log.Printf("read: %v", err)
			return 1
		}
		if err := s.handle(f); err != nil {
			s.end()
			s.log.Printf("%v", err)
			return 1
		}
	}
}

// handle acts on one frame from the host. Stdin and cancel frames for a command that already ended are stale
// (the host may send them while the report is on its way) and are dropped.
func (s *server) handle(f agentproto.Frame) error {
	if ok, err := s.forward(f); ok {
		return err
	}
	switch f.Type {
	case agentproto.FrameProcessOp:
		s.processOp(f)
		return nil
	case agentproto.FrameStdin, agentproto.FrameStdinEOF, agentproto.FrameCancel, agentproto.FrameResize, agentproto.FrameSignal:
		if f.Type == agentproto.FrameSignal {
			if _, err := signalOf(f.Payload); err != nil {
				return err
			}
		}
		if f.Type == agentproto.FrameCancel && s.cancelAttach(f.ID) {
			return nil
		}
		if s.relay(f) {
			return nil
		}
	}
	c := s.cur
	current := c != nil && c.req.ID == f.ID
	switch f.Type {
	case agentproto.FrameRequest:
		s.start(f)
	case agentproto.FrameStdin:
		if current {
			c.feed(bytes.Clone(f.Payload))
		}
	case agentproto.FrameStdinEOF:
		if current {
			c.closeStdin()
		}
	case agentproto.FrameCancel:
		if current {
			c.cancel()
		}
	case agentproto.FrameResize:
		ws, err := agentproto.DecodeWindowSize(f.Payload)
		if err != nil {
			return err
		}
		if current {
			c.resize(ws)
		}
	case agentproto.FrameSignal:
		sig, _ := signalOf(f.Payload)
		if current {
			c.signal(sig)
		}
	default:
		return fmt.Errorf("%w: unexpected frame %v from the host", agentproto.ErrProtocol, f.Type)
	}
	return nil
}

// end ends the session's every command, process and forward. Without a subreaper, a session's serve (a child of
// PID 1: not a supervisor, nor an agent the engine execs for one command) then kills every orphan of the session
// whatever its mark (one whose mark was lowered to another's, one whose supervisor was killed), so none
// outlives the session.
func (s *server) end() {
	s.closeForwards()
	s.stop()
	s.stopSupervisors()
	if s.tree.adopted && os.Getppid() == 1 {
		last := s.tree
		last.anyMark = true
		last.kill(0)
	}
}

// stop cancels the running command, if any, and waits for its report to be sent.
func (s *server) stop() {
	if s.cur != nil {
		s.cur.cancel()
		<-s.cur.done
	}
}

// start decodes a request and starts its command, or reports why it cannot.
func (s *server) start(f agentproto.Frame) {
	received := time.Now()
	// Say at once that the request was read: a host that hears nothing knows the command never started (the
	// sandbox is frozen or the agent stuck) and may safely run it elsewhere after recycling this sandbox.
	_ = s.fw.WriteFrame(agentproto.FrameAccepted, f.ID, nil) // a failure shows up on the read side
	var req agentproto.Request
	err := json.Unmarshal(f.Payload, &req)
	switch {
	case err != nil:
		err = fmt.Errorf("%w: %w", agentproto.ErrBadRequest, err)
	case req.ID != f.ID:
		err = fmt.Errorf("%w: request id %d in a frame for %d", agentproto.ErrBadRequest, req.ID, f.ID)
	default:
		err = req.Validate()
	}
	if err == nil && s.tree.markErr != nil {
		err = fmt.Errorf("%w: %w", errNoMark, s.tree.markErr)
	}
	if err != nil {
		s.report(agentproto.Result{ID: f.ID, ExitCode: 126, StartError: err.Error()})
		return
	}
	switch {
	case req.Detach != nil:
		s.startProcess(req)
		return
	case req.Concurrent:
		s.startConcurrent(req)
		return
	}
	if c := s.cur; c != nil {
		<-c.done // the host sends a request only after the previous report; this is at most a moment
	}
	s.cur = newCommand(req, received, s)
	go s.cur.run()
}

// report sends a command's final frame.
func (s *server) report(res agentproto.Result) {
	body, err := json.Marshal(res)
	if err == nil {
		err = s.fw.WriteFrame(agentproto.FrameResult, res.ID, body)
	}
	if err != nil {
		s.log.Printf("report command %d: %v", res.ID, err)
	}
}
