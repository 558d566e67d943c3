//go:build linux

package main

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// ttyRequest is a TTY request of size rows x cols with stdin.
func (s *session) ttyRequest(rows, cols uint16, argv ...string) agentproto.Request {
	req := s.request(argv...)
	req.TTY = &agentproto.WindowSize{Rows: rows, Cols: cols}
	req.Stdin = true
	return req
}

func TestTTYIsTerminalWithSizeAndStatus(t *testing.T) {
	s := startAgent(t)
	req := s.ttyRequest(33, 111, "sh", "-c", `[ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo tty; stty size; echo err >&2; exit 7`)
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	got := s.run(t, t.Context(), req, stdinR)
	if got.err != nil || got.res.ExitCode != 7 {
		t.Fatalf("got %+v %v", got.res, got.err)
	}
	// One stream: stderr is the terminal too, and the terminal turns \n into \r\n.
	if got.stderr != "" || got.stdout != "tty\r\n33 111\r\nerr\r\n" {
		t.Fatalf("stdout %q stderr %q", got.stdout, got.stderr)
	}
}

func TestTTYResizeAndCtrlC(t *testing.T) {
	s := startAgent(t)
	// The shell waits for input; a resize is seen by stty; ^C (a byte, not a signal from the host) interrupts
	// the foreground sleep through the terminal's line discipline, and the trap reports it.
	req := s.ttyRequest(24, 80, "sh", "-c", `read a; stty size; trap 'echo interrupted; exit 5' INT; echo sleeping; sleep 100 & wait`)
	resize := make(chan agentproto.WindowSize, 1)
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	out := newSignalWriter("sleeping")
	done := make(chan struct{})
	go func() {
		defer close(done)
		resize <- agentproto.WindowSize{Rows: 50, Cols: 132}
		time.Sleep(200 * time.Millisecond) // the resize frame goes out before the line (two writers)
		io.WriteString(stdinW, "go\n")
		select {
		case <-out.seen:
			io.WriteString(stdinW, "\x03")
		case <-time.After(20 * time.Second):
		}
	}()
	start := time.Now()
	res, err := agentproto.RunWith(t.Context(), s.conn(), req, out, nil, stdinR, agentproto.RunOptions{Resize: resize})
	<-done
	if err != nil || res.ExitCode != 5 || res.TimedOut {
		t.Fatalf("got %+v %v, output %q", res, err, out.String())
	}
	if o := out.String(); !strings.Contains(o, "50 132") || !strings.Contains(o, "interrupted") {
		t.Fatalf("output %q", o)
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Fatalf("took %v", el)
	}
}

func TestTTYDeadlineKillsTreeAndBoundsOutput(t *testing.T) {
	s := startAgent(t)
	const marker = 999103
	req := s.ttyRequest(24, 80, "sh", "-c", fmt.Sprintf(escapees, marker)+"echo started; yes | head -c 100000; wait")
	req.TimeoutMS, req.GraceMS, req.StdoutLimit = 1500, 300, 4096
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	got := s.run(t, t.Context(), req, stdinR)
	if got.err != nil || !got.res.TimedOut || !got.res.StdoutTruncated || len(got.stdout) > 4096 {
		t.Fatalf("got %+v %v, %d bytes", got.res, got.err, len(got.stdout))
	}
	checkGone(t, nil, marker)
}
