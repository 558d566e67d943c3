package e2b

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/e2b/proto/process"
	"github.com/sandkeep/sandkeep/internal/e2b/proto/process/processconnect"
	"github.com/sandkeep/sandkeep/internal/service"
)

// procBackend runs "commands" in Go: echo prints its argument, block waits for its context, cat copies stdin.
// Like the engine, it runs a user's commands one at a time unless they ask to run concurrently.
type procBackend struct {
	fakeBackend
	gate sync.RWMutex
}

func (b *procBackend) Exec(ctx context.Context, key sandkeep.Key, ar service.AdmitRequest, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
	script := req.Argv[len(req.Argv)-1]
	if script == "true" {
		return &sandkeep.ExecResult{}, nil
	}
	if req.Concurrent {
		b.gate.RLock()
		defer b.gate.RUnlock()
	} else {
		b.gate.Lock()
		defer b.gate.Unlock()
	}
	if ar.Observer.Started != nil {
		ar.Observer.Started()
	}
	switch {
	case strings.HasPrefix(script, "echo "):
		io.WriteString(req.Stdout, strings.TrimPrefix(script, "echo ")+"\n")
		io.WriteString(req.Stderr, "e\n")
		return &sandkeep.ExecResult{ExitCode: 3}, nil
	case script == "cat":
		io.Copy(req.Stdout, req.Stdin)
		return &sandkeep.ExecResult{}, nil
	case script == "block":
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, errors.New("unknown script")
}

// TestProcessService drives process.Process with a Connect client as the SDK does: Start streams the start
// event, output and the exit code; a process is listed, reachable by tag, fed stdin, and killed by a signal;
// another sandbox's access token does not reach it.
func TestProcessService(t *testing.T) {
	now := time.Now()
	b := &procBackend{}
	h := newHarness(t, t.TempDir(), &b.fakeBackend, &now)
	h.f.b = b // the harness bound the embedded fake; the process tests need this one's Exec
	create := func() (id, token string) {
		st, body := h.do("POST", "/v2/sandboxes", "key-acme", `{}`)
		if st != 201 {
			t.Fatalf("create: %d %v", st, body)
		}
		return body["sandboxID"].(string), body["envdAccessToken"].(string)
	}
	id, tok := create()
	other, otherTok := create()
	client := func(sandbox, token string) processconnect.ProcessClient {
		return processconnect.NewProcessClient(http.DefaultClient, h.srv.URL+"/e2b/envd", connect.WithInterceptors(headers{
			"E2b-Sandbox-Id": sandbox, "X-Access-Token": token}))
	}
	c := client(id, tok)
	ctx := t.Context()

	start := func(script string, tag *string, stdin bool) *connect.ServerStreamForClient[process.StartResponse] {
		s, err := c.Start(ctx, connect.NewRequest(&process.StartRequest{Tag: tag, Stdin: &stdin,
			Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", script}}}))
		if err != nil {
			t.Fatal(err)
		}
		if !s.Receive() || s.Msg().GetEvent().GetStart().GetPid() == 0 {
			t.Fatalf("no start event: %v", s.Err())
		}
		return s
	}
	s := start("echo hi", nil, false)
	var out, errOut string
	var end *process.ProcessEvent_EndEvent
	for s.Receive() {
		ev := s.Msg().GetEvent()
		out += string(ev.GetData().GetStdout())
		errOut += string(ev.GetData().GetStderr())
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
	}
	if out != "hi\n" || errOut != "e\n" || end == nil || end.ExitCode != 3 || !end.Exited {
		t.Fatalf("echo: out %q err %q end %v (%v)", out, errOut, end, s.Err())
	}

	tag := "server"
	blocked := start("block", &tag, false)
	list, err := c.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil || len(list.Msg.Processes) != 1 || list.Msg.Processes[0].GetTag() != "server" {
		t.Fatalf("list: %v %v", list, err)
	}
	pid := list.Msg.Processes[0].Pid
	// A command runs beside the background process (the front asks for concurrent commands), not after it.
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	beside, err := c.Start(bctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo beside"}}}))
	if err != nil {
		t.Fatal(err)
	}
	out = ""
	for beside.Receive() {
		out += string(beside.Msg().GetEvent().GetData().GetStdout())
	}
	cancel()
	if out != "beside\n" {
		t.Fatalf("a command beside the background process: %q (%v)", out, beside.Err())
	}
	// Another sandbox's client does not see it, cannot signal it, and a forged id with its token is refused.
	oc := client(other, otherTok)
	if l, err := oc.List(ctx, connect.NewRequest(&process.ListRequest{})); err != nil || len(l.Msg.Processes) != 0 {
		t.Errorf("another sandbox lists %v %v", l, err)
	}
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	_, err = oc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("signal from another sandbox: %v, want not_found", err)
	}
	if _, err := client(id, otherTok).List(ctx, connect.NewRequest(&process.ListRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("another sandbox's token: %v, want unauthenticated", err)
	}
	if _, err := client(id, "").List(ctx, connect.NewRequest(&process.ListRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("no token: %v, want unauthenticated", err)
	}
	// By tag, a signal ends it; its stream ends with the end event.
	bytag := &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "server"}}
	if _, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: bytag, Signal: process.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatal(err)
	}
	var ended bool
	for blocked.Receive() {
		ended = ended || blocked.Msg().GetEvent().GetEnd() != nil
	}
	if !ended {
		t.Errorf("the killed process's stream has no end event: %v", blocked.Err())
	}
	if l, _ := c.List(ctx, connect.NewRequest(&process.ListRequest{})); len(l.Msg.Processes) != 0 {
		t.Errorf("still listed after the kill: %v", l.Msg.Processes)
	}

	// stdin: SendInput, then CloseStdin ends cat.
	cat := start("cat", nil, true)
	catPid := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 0}}
	l, _ := c.List(ctx, connect.NewRequest(&process.ListRequest{}))
	catPid.Selector = &process.ProcessSelector_Pid{Pid: l.Msg.Processes[0].Pid}
	if _, err := c.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: catPid,
		Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("typed")}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: catPid})); err != nil {
		t.Fatal(err)
	}
	out = ""
	for cat.Receive() {
		out += string(cat.Msg().GetEvent().GetData().GetStdout())
	}
	if out != "typed" {
		t.Errorf("cat: %q (%v)", out, cat.Err())
	}
}

// headers is a client interceptor that sets fixed request headers, as the SDK's fetch wrapper does.
type headers map[string]string

func (h headers) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		for k, v := range h {
			req.Header().Set(k, v)
		}
		return next(ctx, req)
	}
}

func (h headers) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		for k, v := range h {
			conn.RequestHeader().Set(k, v)
		}
		return conn
	}
}

func (h headers) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
