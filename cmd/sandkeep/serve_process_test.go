package main

import (
	"bytes"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/testutil/kubetest"
)

// processesServed: serve carries processes on the sandbox's agent channel (Docker's: its socket under runc, or a
// relay under gVisor and the exec transport; the kubernetes driver's pod channel); the kubernetes driver with the
// exec transport answers PROCESS_UNAVAILABLE.
func (c *cli) processesServed() bool {
	if kubetest.Selected() {
		return os.Getenv("SANDKEEP_TRANSPORT") != "exec"
	}
	return true
}

// TestServeProcesses: through the API and the Go SDK, a dev server started as a process runs on while the
// user's commands run beside it; it is listed, written to, read back (the ring, then followed), signalled and
// killed by tag or pid; another tenant's token finds nothing of it.
func TestServeProcesses(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	s := c.startServer(t)
	tok := c.createToken(t, c.ten("acme"), "procs", "admin")
	cl := s.client(t, tok.Token)
	ctx := bounded(t)
	req := client.StartRequest{Command: "echo ready; while read l; do echo got $l; done; echo closed; sleep 600",
		Tag: "dev", Stdin: true, Lifetime: 10 * time.Minute}
	if !c.processesServed() {
		_, err := cl.StartProcess(ctx, "alice", req)
		wantAPIError(t, err, http.StatusUnprocessableEntity, fault.ProcessUnavailable)
		return
	}
	p, err := cl.StartProcess(ctx, "alice", req)
	if err != nil || !p.Running || p.PID <= 0 || p.Tag != "dev" || p.RequestID == "" {
		t.Fatalf("start: %+v %v", p, err)
	}
	// Commands run beside it, each at once.
	for range 3 {
		res, err := cl.Exec(ctx, "alice", client.ExecRequest{Command: "echo beside", Timeout: 30 * time.Second})
		if err != nil || res.Stdout != "beside\n" {
			t.Fatalf("exec beside the process: %+v %v", res, err)
		}
	}
	ps, err := cl.Processes(ctx, "alice")
	if err != nil || len(ps) != 1 || ps[0].PID != p.PID || !ps[0].Running || !ps[0].Stdin {
		t.Fatalf("processes: %+v %v", ps, err)
	}
	dev := client.ProcessRef{Tag: "dev"}
	if err := cl.Input(ctx, "alice", dev, []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	if err := cl.CloseStdin(ctx, "alice", client.ProcessRef{PID: p.PID}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	var out bytes.Buffer
	for time.Now().Before(deadline) {
		out.Reset()
		got, err := cl.ProcessOutput(ctx, "alice", dev, client.AttachOptions{}, &out, nil)
		if err != nil || !got.Running {
			t.Fatalf("output: %+v %v", got, err)
		}
		if out.String() == "ready\ngot one\nclosed\n" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out.String() != "ready\ngot one\nclosed\n" {
		t.Fatalf("output %q", out.String())
	}
	err = cl.Input(ctx, "alice", dev, []byte("x"))
	wantAPIError(t, err, http.StatusBadRequest, fault.InvalidArgument)
	err = cl.Signal(ctx, "alice", dev, "NOPE")
	wantAPIError(t, err, http.StatusBadRequest, fault.InvalidArgument)

	// A process on a terminal sees its window resized.
	term, err := cl.StartProcess(ctx, "alice", client.StartRequest{Command: "stty size; read l; stty size; sleep 600",
		Tag: "term", Stdin: true, TTY: &client.WindowSize{Rows: 24, Cols: 80}, Lifetime: 10 * time.Minute})
	if err != nil {
		t.Fatalf("start on a terminal: %v", err)
	}
	termRef := client.ProcessRef{PID: term.PID}
	waitOutput := func(want string) string {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			out.Reset()
			if _, err := cl.ProcessOutput(ctx, "alice", termRef, client.AttachOptions{}, &out, nil); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(out.String(), want) {
				break
			}
		}
		return out.String()
	}
	if got := waitOutput("24 80"); !strings.Contains(got, "24 80") {
		t.Fatalf("terminal output %q: want its size, 24 80", got)
	}
	if err := cl.Resize(ctx, "alice", termRef, client.WindowSize{Rows: 50, Cols: 132}); err != nil {
		t.Fatalf("resize: %v", err)
	}
	if err := cl.Input(ctx, "alice", termRef, []byte("go\r")); err != nil {
		t.Fatal(err)
	}
	if got := waitOutput("50 132"); !strings.Contains(got, "50 132") {
		t.Fatalf("terminal output %q: want the size before (24 80) and after the resize (50 132)", got)
	}
	if err := cl.Kill(ctx, "alice", termRef); err != nil {
		t.Fatal(err)
	}

	// Another tenant sees none of it and cannot touch it.
	other := s.client(t, c.createToken(t, c.ten("globex"), "procs", "admin").Token)
	if ps, err := other.Processes(ctx, "alice"); err != nil || len(ps) != 0 {
		t.Errorf("another tenant lists %+v %v", ps, err)
	}
	err = other.Kill(ctx, "alice", client.ProcessRef{PID: p.PID})
	wantAPIError(t, err, http.StatusNotFound, fault.ProcessNotFound)

	// A follower sees it end when it is killed.
	type ended struct {
		p   *client.Process
		out string
		err error
	}
	done := make(chan ended, 1)
	go func() {
		var buf bytes.Buffer
		got, err := cl.ProcessOutput(ctx, "alice", client.ProcessRef{PID: p.PID}, client.AttachOptions{Follow: true}, &buf, nil)
		done <- ended{got, buf.String(), err}
	}()
	time.Sleep(300 * time.Millisecond)
	if err := cl.Kill(ctx, "alice", dev); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-done:
		if e.err != nil || e.p.Running || !e.p.Killed || !strings.HasPrefix(e.out, "ready\n") {
			t.Fatalf("follower: %+v %q %v", e.p, e.out, e.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the follower did not see the kill")
	}
	err = cl.Kill(ctx, "alice", dev)
	wantAPIError(t, err, http.StatusConflict, fault.ProcessExited)
}
