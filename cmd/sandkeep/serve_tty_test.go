package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// screen collects a TTY's output and lets a test wait for text in it.
type screen struct {
	mu   sync.Mutex
	buf  strings.Builder
	more chan struct{}
}

func newScreen() *screen { return &screen{more: make(chan struct{})} }

func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(p)
	close(s.more)
	s.more = make(chan struct{})
	return len(p), nil
}

func (s *screen) wait(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		s.mu.Lock()
		got, more := s.buf.String(), s.more
		s.mu.Unlock()
		if strings.Contains(got, want) {
			return
		}
		select {
		case <-more:
		case <-timeout:
			t.Fatalf("never saw %q in %q", want, got)
		}
	}
}

// TestServeSDKTTY drives a TTY command through the server's WebSocket route with the Go SDK: the size, typed
// input, a resize, Ctrl-C reaching the command's foreground process, and the exit status; and a token without
// the exec scope is refused before any upgrade.
func TestServeSDKTTY(t *testing.T) {
	c := newCLI(t)
	s := c.startServer(t)
	tenant := c.ten("ttyapi")
	cl := s.client(t, c.createToken(t, tenant, "sdk", "exec").Token)

	in, inW := io.Pipe()
	defer inW.Close()
	out := newScreen()
	resize := make(chan client.WindowSize, 1)
	type answer struct {
		res *client.ExecResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := cl.ExecTTY(bounded(t), "alice", client.ExecRequest{Argv: []string{"sh"}, Timeout: 5 * time.Minute},
			client.TTY{Input: in, Output: out, Size: client.WindowSize{Rows: 33, Cols: 101}, Resize: resize})
		done <- answer{res, err}
	}()
	io.WriteString(inW, "stty size | tr ' ' x; echo sum-$((20+22))\r")
	out.wait(t, "33x101")
	out.wait(t, "sum-42")
	resize <- client.WindowSize{Rows: 50, Cols: 140}
	deadline := time.Now().Add(30 * time.Second)
	for {
		io.WriteString(inW, "echo now-$(stty size | tr ' ' x)-e\"nd\"\r")
		time.Sleep(200 * time.Millisecond)
		out.mu.Lock()
		ok := strings.Contains(out.buf.String(), "now-50x140-end")
		out.mu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the resize never reached the sandbox")
		}
	}
	if !gvisor() { // under gVisor its terminal turns no Ctrl-C into SIGINT (TestExecTTY)
		io.WriteString(inW, "sleep 100\r")
		time.Sleep(500 * time.Millisecond)
		io.WriteString(inW, "\x03")
		io.WriteString(inW, "echo status-$?\r")
		out.wait(t, "status-130")
	}
	io.WriteString(inW, "exit 4\r")
	a := <-done
	if a.err != nil || a.res.ExitCode != 4 || a.res.TimedOut || a.res.Stdout != "" {
		t.Fatalf("result %+v, %v", a.res, a.err)
	}

	// A read-only token: FORBIDDEN before the upgrade.
	ro := s.client(t, c.createToken(t, tenant, "ro", "read").Token)
	_, err := ro.ExecTTY(bounded(t), "alice", client.ExecRequest{Argv: []string{"true"}}, client.TTY{})
	wantAPIError(t, err, http.StatusForbidden, fault.Forbidden)
}

// TestServeSDKPortForward reaches an HTTP server of ours in a sandbox through the server's port-forward route
// with the Go SDK, and gets the coded refusals when nothing listens or the sandbox does not run.
func TestServeSDKPortForward(t *testing.T) {
	c := newCLI(t)
	s := c.startServerEnv(t, []string{"SANDKEEP_IMAGE=" + testutil.ProbeImage(t)})
	tenant := c.ten("pfapi")
	cl := s.client(t, c.createToken(t, tenant, "sdk", "exec,read").Token)

	_, err := cl.DialPort(bounded(t), "alice", 8080)
	wantAPIError(t, err, http.StatusNotFound, fault.NotFound)

	served := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ready := newScreen()
	go func() {
		_, err := cl.ExecStream(ctx, "alice", client.ExecRequest{Argv: []string{testutil.ProbePath, "serve", "127.0.0.1:8080", "via-api"},
			Timeout: 5 * time.Minute}, ready, nil)
		served <- err
	}()
	ready.wait(t, "listening")

	for i := range 3 {
		conn, err := cl.DialPort(bounded(t), "alice", 8080)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET /api-%d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", i)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		conn.Close()
		if want := fmt.Sprintf("via-api /api-%d", i); string(body) != want {
			t.Fatalf("body %q, want %q", body, want)
		}
	}
	_, err = cl.DialPort(bounded(t), "alice", 8081)
	wantAPIError(t, err, http.StatusBadGateway, fault.PortUnreachable)
	_, err = cl.DialPort(bounded(t), "alice", 0)
	wantAPIError(t, err, http.StatusBadRequest, fault.RequestInvalid)
	cancel()
	<-served
}
