package main

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/e2b/proto/process"
	"github.com/sandkeep/sandkeep/internal/e2b/proto/process/processconnect"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/mcpserver"
)

// e2bHeaders sets the envd headers the e2b SDK sends on every call.
type e2bHeaders map[string]string

func (h e2bHeaders) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		for k, v := range h {
			req.Header().Set(k, v)
		}
		return next(ctx, req)
	}
}

func (h e2bHeaders) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		for k, v := range h {
			conn.RequestHeader().Set(k, v)
		}
		return conn
	}
}

func (h e2bHeaders) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// TestE2BProcessesShared: the E2B front's processes are the engine's. A command started through E2B's
// process.Process (background, tagged) is listed by the native API (the Go SDK) and MCP under the sandbox's user
// (e2b-<id>), its output read there, and its start and end recorded as process_started and process_ended in a
// run of the store; a process started through the native API is listed by E2B, connected to for its output and
// killed through E2B, which the native API then reports killed. Where the engine has no processes (the
// kubernetes driver, gVisor, the exec transport) the front runs commands itself and the native API answers
// PROCESS_UNAVAILABLE.
func TestE2BProcessesShared(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	s := c.startServer(t)
	tenant := c.ten("acme")
	tok := c.createToken(t, tenant, "e2b", "").Token
	ans := s.raw(t, "POST", "/e2b/v2/sandboxes", "", strings.NewReader(`{"templateID":"base","timeout":600}`),
		"X-API-KEY", tok, "Content-Type", "application/json")
	var sbx struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal([]byte(ans.body), &sbx); err != nil || ans.status != http.StatusCreated || sbx.SandboxID == "" {
		t.Fatalf("create: %d %s (%v)", ans.status, ans.body, err)
	}
	user := "e2b-" + sbx.SandboxID
	pc := processconnect.NewProcessClient(http.DefaultClient, s.url+"/e2b/envd", connect.WithInterceptors(e2bHeaders{
		"E2b-Sandbox-Id": sbx.SandboxID, "X-Access-Token": sbx.EnvdAccessToken}))
	cl := s.client(t, tok)
	ctx := bounded(t)

	// Started through E2B, in the background.
	tag := "dev"
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	st, err := pc.Start(sctx, connect.NewRequest(&process.StartRequest{Tag: &tag,
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo ready; sleep 600"}}}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", st.Err())
	}
	pid := int(st.Msg().GetEvent().GetStart().GetPid())
	if !st.Receive() || string(st.Msg().GetEvent().GetData().GetStdout()) != "ready\n" {
		t.Fatalf("first output: %v %v", st.Msg(), st.Err())
	}
	if !c.processesServed() {
		_, err := cl.Processes(ctx, user)
		wantAPIError(t, err, http.StatusUnprocessableEntity, fault.ProcessUnavailable)
		return
	}
	ps, err := cl.Processes(ctx, user)
	if err != nil || len(ps) != 1 || ps[0].PID != pid || ps[0].Tag != "dev" || !ps[0].Running {
		t.Fatalf("the native API lists %+v (%v), want the E2B process %d", ps, err, pid)
	}
	// MCP's list_processes for the same user shows it too.
	cs, err := s.mcpHTTP(t, map[string]string{"Authorization": "Bearer " + tok, "Sandkeep-User": user})
	if err != nil {
		t.Fatal(err)
	}
	ml := mcpOut[mcpserver.ProcessList](t, mcpCall(t, cs, mcpserver.ToolProcesses, map[string]any{}))
	if len(ml.Processes) != 1 || ml.Processes[0].PID != pid || !ml.Processes[0].Running {
		t.Fatalf("MCP lists %+v, want the E2B process %d", ml.Processes, pid)
	}
	var out strings.Builder
	if _, err := cl.ProcessOutput(ctx, user, client.ProcessRef{Tag: "dev"}, client.AttachOptions{}, &out, nil); err != nil || out.String() != "ready\n" {
		t.Fatalf("its output through the native API: %q %v", out.String(), err)
	}
	// Killed through the native API: the E2B stream ends with the end event.
	if err := cl.Kill(ctx, user, client.ProcessRef{PID: pid}); err != nil {
		t.Fatal(err)
	}
	var end *process.ProcessEvent_EndEvent
	for st.Receive() {
		if e := st.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if end == nil || end.ExitCode == 0 {
		t.Fatalf("the E2B stream of a killed process ended with %v (%v)", end, st.Err())
	}
	// Its run records its start and its end.
	var runs []runRecord
	decodeJSON(t, c.run(t, "runs", "--json", "--tenant", tenant, "--user", user, "--limit", "0").want(t, 0).stdout, &runs)
	var started, ended bool
	for _, r := range runs {
		for _, e := range c.eventsOf(t, r.ID) {
			started = started || e.Name == "process_started" && strings.Contains(string(e.Payload), `"pid":`+strconv.Itoa(pid))
			ended = ended || e.Name == "process_ended" && strings.Contains(string(e.Payload), `"pid":`+strconv.Itoa(pid))
		}
	}
	if !started || !ended {
		t.Fatalf("runs of %s: process_started %v, process_ended %v (%d runs)", user, started, ended, len(runs))
	}

	// Started through the native API: E2B lists it, connects to it for its output, and kills it.
	np, err := cl.StartProcess(ctx, user, client.StartRequest{Command: "while true; do echo tick; sleep 0.2; done",
		Tag: "native", Lifetime: 10 * time.Minute})
	if err != nil || !np.Running {
		t.Fatalf("native start: %+v %v", np, err)
	}
	list, err := pc.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil || len(list.Msg.Processes) != 1 || int(list.Msg.Processes[0].Pid) != np.PID || list.Msg.Processes[0].GetTag() != "native" {
		t.Fatalf("E2B lists %v (%v), want the native process %d", list.Msg.GetProcesses(), err, np.PID)
	}
	byTag := &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "native"}}
	conn, err := pc.Connect(sctx, connect.NewRequest(&process.ConnectRequest{Process: byTag}))
	if err != nil {
		t.Fatal(err)
	}
	if !conn.Receive() || int(conn.Msg().GetEvent().GetStart().GetPid()) != np.PID {
		t.Fatalf("connect: %v %v", conn.Msg(), conn.Err())
	}
	if !conn.Receive() || !strings.Contains(string(conn.Msg().GetEvent().GetData().GetStdout()), "tick") {
		t.Fatalf("connected output: %v %v", conn.Msg(), conn.Err())
	}
	byPID := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: uint32(np.PID)}}
	if _, err := pc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: byPID, Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	ps, err = cl.Processes(ctx, user)
	i := slices.IndexFunc(ps, func(p client.Process) bool { return p.PID == np.PID })
	if err != nil || i < 0 || ps[i].Running || !ps[i].Killed {
		t.Fatalf("after E2B's kill the native API lists %+v (%v)", ps, err)
	}
	// A kill of an ended process is not found (the SDK's kill answers false).
	_, err = pc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: byPID, Signal: process.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("kill of an ended process: %v, want not_found", err)
	}
}
