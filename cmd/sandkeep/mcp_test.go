package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/mcpserver"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// These tests speak MCP to sandkeep over Docker the three ways a client can: a `sandkeep mcp` subprocess over
// stdio, `/mcp` of a real `sandkeep serve` over streamable HTTP, and the in-process server over the SDK's
// in-memory transport.

func mcpConnect(t *testing.T, tr mcp.Transport) *mcp.ClientSession {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "sandkeep-test", Version: "v0"}, nil).Connect(bounded(t), tr, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	return cs
}

// mcpCall calls a tool; a protocol error fails the test: every failure must come back as a tool result.
func mcpCall(t *testing.T, cs *mcp.ClientSession, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(bounded(t), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: a protocol error, not a tool result: %v", tool, err)
	}
	return res
}

func mcpText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// mcpOut decodes a successful call's structured content.
func mcpOut[T any](t *testing.T, res *mcp.CallToolResult) T {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool call failed: %s", mcpText(res))
	}
	var out T
	b, err := json.Marshal(res.StructuredContent)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	if err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
	return out
}

// mcpWantError checks that res is a tool error with code, said both in _meta and as text, without structured
// content (clients check that against the tool's output schema).
func mcpWantError(t *testing.T, res *mcp.CallToolResult, code fault.Code) {
	t.Helper()
	if !res.IsError {
		t.Fatalf("tool call succeeded, want a %s tool error: %s", code, mcpText(res))
	}
	if res.StructuredContent != nil {
		t.Errorf("tool error carries structured content %v", res.StructuredContent)
	}
	var te mcpserver.ToolError
	b, _ := json.Marshal(res.Meta[mcpserver.ErrorMetaKey])
	if err := json.Unmarshal(b, &te); err != nil || te.Code != code || te.Message == "" || te.Hint == "" {
		t.Fatalf("tool error %s (%v), want code %s with a message and a hint", b, err, code)
	}
	if !strings.HasPrefix(mcpText(res), string(code)+": ") {
		t.Errorf("tool error text %q does not start with its code %s", mcpText(res), code)
	}
}

// mcpExercise runs the tools a coding agent uses on a fresh sandbox of user, through cs, and checks what a user
// would notice. It returns the number of commands it ran.
func mcpExercise(t *testing.T, cs *mcp.ClientSession, tenant, user string) int {
	t.Helper()
	ctx := bounded(t)
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
		if tool.Description == "" || tool.InputSchema == nil {
			t.Errorf("tool %s has no description or input schema", tool.Name)
		}
	}
	slices.Sort(names)
	if want := []string{"create_snapshot", "delete_snapshot", "exec", "fork_sandbox", "kill_process", "list_files", "list_processes",
		"list_snapshots", "process_input", "process_output", "read_file", "restore_snapshot", "sandbox_status", "start_process",
		"write_file"}; !slices.Equal(names, want) {
		t.Errorf("tools %v, want %v", names, want)
	}

	st := mcpOut[mcpserver.StatusOutput](t, mcpCall(t, cs, mcpserver.ToolSandboxStatus, map[string]any{}))
	if st.Exists || st.Tenant != tenant || st.User != user {
		t.Errorf("sandbox_status before the first command: %+v", st)
	}

	out := mcpOut[mcpserver.ExecOutput](t, mcpCall(t, cs, mcpserver.ToolExec, map[string]any{"command": "echo hi"}))
	if out.ExitCode != 0 || out.Stdout != "hi\n" || out.Stderr != "" || out.TimedOut {
		t.Errorf("exec echo hi: %+v", out)
	}
	// A failing command is a result, not a tool error.
	out = mcpOut[mcpserver.ExecOutput](t, mcpCall(t, cs, mcpserver.ToolExec, map[string]any{
		"argv": []string{"sh", "-c", "echo no >&2; id -u; pwd; exit 7"}, "workdir": "sub/dir"}))
	uid := sandboxUID(t, out.Stdout)
	if out.ExitCode != 7 || out.Stdout != uid+"\n/workspace/sub/dir\n" || out.Stderr != "no\n" {
		t.Errorf("exec exit 7: %+v", out)
	}

	w := mcpOut[mcpserver.WriteFileOutput](t, mcpCall(t, cs, mcpserver.ToolWriteFile, map[string]any{
		"path": "notes/todo.txt", "content": "héllo\n"}))
	if w.Bytes != int64(len("héllo\n")) {
		t.Errorf("write_file: %+v", w)
	}
	r := mcpOut[mcpserver.ReadFileOutput](t, mcpCall(t, cs, mcpserver.ToolReadFile, map[string]any{"path": "notes/todo.txt"}))
	if r.Content != "héllo\n" || r.Encoding != "utf-8" || r.Size != w.Bytes {
		t.Errorf("read_file: %+v", r)
	}
	bin := []byte{0, 1, 2, 0xff, 0xfe, '\n'}
	mcpOut[mcpserver.WriteFileOutput](t, mcpCall(t, cs, mcpserver.ToolWriteFile, map[string]any{
		"path": "/workspace/notes/blob.bin", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64", "mode": "0755"}))
	r = mcpOut[mcpserver.ReadFileOutput](t, mcpCall(t, cs, mcpserver.ToolReadFile, map[string]any{"path": "notes/blob.bin"}))
	if got, err := base64.StdEncoding.DecodeString(r.Content); r.Encoding != "base64" || err != nil || string(got) != string(bin) {
		t.Errorf("read_file of binary data: %+v", r)
	}
	// The command sees what write_file wrote, owned by the sandbox user.
	out = mcpOut[mcpserver.ExecOutput](t, mcpCall(t, cs, mcpserver.ToolExec, map[string]any{
		"command": "cat notes/todo.txt; stat -c '%u %a' notes/todo.txt notes/blob.bin notes; od -An -tx1 notes/blob.bin"}))
	if want := "héllo\n" + uid + " 644\n" + uid + " 755\n" + uid + " 755\n 00 01 02 ff fe 0a\n"; out.ExitCode != 0 || out.Stdout != want {
		t.Errorf("the written files seen by a command: %+v, want stdout %q", out, want)
	}

	ls := mcpOut[mcpserver.ListFilesOutput](t, mcpCall(t, cs, mcpserver.ToolListFiles, map[string]any{"path": "notes"}))
	var entries []string
	for _, e := range ls.Entries {
		entries = append(entries, e.Name+":"+e.Type+":"+e.Mode)
	}
	if want := []string{"blob.bin:file:0755", "todo.txt:file:0644"}; !slices.Equal(entries, want) || ls.Truncated {
		t.Errorf("list_files notes: %v (truncated %v), want %v", entries, ls.Truncated, want)
	}
	ls = mcpOut[mcpserver.ListFilesOutput](t, mcpCall(t, cs, mcpserver.ToolListFiles, map[string]any{}))
	entries = entries[:0]
	for _, e := range ls.Entries {
		entries = append(entries, e.Name+":"+e.Type)
	}
	if want := []string{"notes:dir", "sub:dir"}; !slices.Equal(entries, want) {
		t.Errorf("list_files of the workspace: %v, want %v", entries, want)
	}

	st = mcpOut[mcpserver.StatusOutput](t, mcpCall(t, cs, mcpserver.ToolSandboxStatus, map[string]any{}))
	if !st.Exists || st.State != "running" || st.Tenant != tenant || st.User != user || !strings.HasPrefix(st.Name, "sandkeep-u-") || st.Image == "" {
		t.Errorf("sandbox_status: %+v", st)
	}

	// Failures are tool results with a code, and the session goes on.
	mcpWantError(t, mcpCall(t, cs, mcpserver.ToolReadFile, map[string]any{"path": "notes/missing.txt"}), fault.FileNotFound)
	mcpWantError(t, mcpCall(t, cs, mcpserver.ToolReadFile, map[string]any{"path": "../../etc/passwd"}), fault.InvalidPath)
	// Input outside the published schema is refused by it, before anything runs.
	mcpWantError(t, mcpCall(t, cs, mcpserver.ToolExec, map[string]any{"command": "true", "timeout_seconds": 99999}), fault.InvalidArgument)
	mcpWantError(t, mcpCall(t, cs, mcpserver.ToolExec, map[string]any{"command": "true", "argv": []string{"true"}}), fault.InvalidArgument)
	out = mcpOut[mcpserver.ExecOutput](t, mcpCall(t, cs, mcpserver.ToolExec, map[string]any{"argv": []string{"true"}}))
	if out.ExitCode != 0 {
		t.Errorf("exec after tool errors: %+v", out)
	}
	return 4
}

// syncBuffer is a strings.Builder safe for a process's writer goroutine and the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestMCPStdio runs `sandkeep mcp` as a coding agent does: a subprocess speaking MCP on its stdin and stdout.
func TestMCPStdio(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	tenant := c.ten("acme")
	ctx := bounded(t)
	cmd := c.command(ctx, transportEnv(), "mcp", "--tenant", tenant, "--user", "alice")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sandkeep mcp stderr:\n%s", stderr)
		}
	})
	cs := mcpConnect(t, &mcp.CommandTransport{Command: cmd})
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = cs.Close()
		}
	})
	if init := cs.InitializeResult(); init.ServerInfo.Name != "sandkeep" || init.Instructions == "" {
		t.Errorf("server info %+v, instructions %q", init.ServerInfo, init.Instructions)
	}
	execs := mcpExercise(t, cs, tenant, "alice")

	// The client closing stdin ends the server cleanly.
	closed = true
	if err := cs.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Errorf("sandkeep mcp ended %v when its client disconnected, want exit 0", cmd.ProcessState)
	}

	// Every command was recorded as a run.
	r := c.run(t, "runs", "--json", "--tenant", tenant).want(t, 0)
	var runs []store.Run
	decodeJSON(t, r.stdout, &runs)
	if len(runs) != execs {
		t.Errorf("%d runs recorded, want one per command (%d): %+v", len(runs), execs, runs)
	}
	for _, run := range runs {
		if run.User != "alice" || run.Status != store.StatusSucceeded {
			t.Errorf("run %+v: want alice's, succeeded", run)
		}
	}
}

// headerTransport adds fixed headers to every request, as an MCP client configured with headers does.
type headerTransport struct {
	h    map[string]string
	base http.RoundTripper
}

func (rt headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range rt.h {
		r.Header.Set(k, v)
	}
	return rt.base.RoundTrip(r)
}

// mcpHTTP connects to the server's /mcp with headers.
func (s *server) mcpHTTP(t *testing.T, headers map[string]string) (*mcp.ClientSession, error) {
	t.Helper()
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr := &mcp.StreamableClientTransport{Endpoint: s.url + "/mcp", MaxRetries: -1,
		HTTPClient: &http.Client{Transport: headerTransport{h: headers, base: base}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "sandkeep-test", Version: "v0"}, nil).Connect(bounded(t), tr, nil)
	if err == nil {
		t.Cleanup(func() { _ = cs.Close() })
	}
	return cs, err
}

// TestMCPServe speaks MCP to /mcp of a real `sandkeep serve`: a bearer token names the tenant and its scopes,
// the Sandkeep-User header the user.
func TestMCPServe(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	s := c.startServer(t)
	tenant, other := c.ten("acme"), c.ten("globex")
	full := c.createToken(t, tenant, "agent", "").Token
	readOnly := c.createToken(t, tenant, "viewer", "read").Token
	otherTok := c.createToken(t, other, "agent", "").Token

	cs, err := s.mcpHTTP(t, map[string]string{"Authorization": "Bearer " + full, "Sandkeep-User": "alice", "X-Request-Id": "mcp-req-1"})
	if err != nil {
		t.Fatal(err)
	}
	mcpExercise(t, cs, tenant, "alice")

	// The commands are the tenant's runs, with the request id on their events.
	api := s.client(t, full)
	runs, err := api.Runs(bounded(t), client.RunFilter{User: "alice"})
	if err != nil || len(runs) == 0 {
		t.Fatalf("runs of alice: %+v, %v", runs, err)
	}
	evs, err := api.Events(bounded(t), runs[0].ID, 0)
	if err != nil || len(evs) == 0 {
		t.Fatalf("events of %s: %+v, %v", runs[0].ID, evs, err)
	}
	for _, e := range evs {
		if e.RequestID != "mcp-req-1" {
			t.Errorf("event %s carries request id %q, want mcp-req-1", e.Name, e.RequestID)
		}
	}

	t.Run("scopes", func(t *testing.T) {
		ro, err := s.mcpHTTP(t, map[string]string{"Authorization": "Bearer " + readOnly, "Sandkeep-User": "alice"})
		if err != nil {
			t.Fatal(err)
		}
		mcpWantError(t, mcpCall(t, ro, mcpserver.ToolExec, map[string]any{"command": "touch /workspace/pwned"}), fault.Forbidden)
		mcpWantError(t, mcpCall(t, ro, mcpserver.ToolWriteFile, map[string]any{"path": "pwned", "content": "x"}), fault.Forbidden)
		mcpWantError(t, mcpCall(t, ro, mcpserver.ToolReadFile, map[string]any{"path": "notes/todo.txt"}), fault.Forbidden)
		if st := mcpOut[mcpserver.StatusOutput](t, mcpCall(t, ro, mcpserver.ToolSandboxStatus, map[string]any{})); !st.Exists || st.User != "alice" {
			t.Errorf("sandbox_status with the read scope: %+v", st)
		}
		res, err := api.Exec(bounded(t), "alice", client.ExecRequest{Argv: []string{"ls", "/workspace"}})
		if err != nil || res.Stdout != "notes\nsub\n" {
			t.Errorf("the workspace after refused tool calls: %+v, %v", res, err)
		}
	})

	t.Run("other tenant", func(t *testing.T) {
		// The same user name under another tenant's token is another, empty sandbox.
		cs, err := s.mcpHTTP(t, map[string]string{"Authorization": "Bearer " + otherTok, "Sandkeep-User": "alice"})
		if err != nil {
			t.Fatal(err)
		}
		if st := mcpOut[mcpserver.StatusOutput](t, mcpCall(t, cs, mcpserver.ToolSandboxStatus, map[string]any{})); st.Exists || st.Tenant != other {
			t.Errorf("sandbox_status under another tenant: %+v", st)
		}
		mcpWantError(t, mcpCall(t, cs, mcpserver.ToolReadFile, map[string]any{"path": "notes/todo.txt"}), fault.FileNotFound)
	})

	t.Run("refused", func(t *testing.T) {
		if _, err := s.mcpHTTP(t, map[string]string{"Sandkeep-User": "alice"}); err == nil {
			t.Error("an MCP session without a token was accepted")
		}
		if _, err := s.mcpHTTP(t, map[string]string{"Authorization": "Bearer " + full}); err == nil {
			t.Error("an MCP session without a user was accepted")
		}
		init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}`
		for _, tt := range []struct {
			name, token, user string
			status            int
			code              string
		}{
			{"no token", "", "alice", http.StatusUnauthorized, "UNAUTHENTICATED"},
			{"bad token", "skt_" + strings.Repeat("x", 43), "alice", http.StatusUnauthorized, "UNAUTHENTICATED"},
			{"no user", full, "", http.StatusBadRequest, ""},
		} {
			hdr := []string{"Content-Type", "application/json", "Accept", "application/json, text/event-stream"}
			if tt.user != "" {
				hdr = append(hdr, "Sandkeep-User", tt.user)
			}
			a := s.raw(t, "POST", "/mcp", tt.token, strings.NewReader(init), hdr...)
			if a.status != tt.status || !strings.Contains(a.body, `"code":"`+tt.code) {
				t.Errorf("%s: %d %s, want %d %s", tt.name, a.status, a.body, tt.status, tt.code)
			}
		}
	})
}

// TestMCPInMemory serves the tools in-process, over the real service (Manager, Docker driver, store) that
// `sandkeep mcp` opens, through the SDK's in-memory transport; and cancels a call.
func TestMCPInMemory(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	tenant := c.ten("acme")
	logs := &syncBuffer{}
	g := &globals{home: c.home, image: testutil.TestImage(t), agent: testutil.AgentBinary(t),
		transport: os.Getenv("SANDKEEP_TRANSPORT"), store: filepath.Join(c.home, "sandkeep.db"), logLevel: "warn",
		stdin: strings.NewReader(""), stdout: logs, stderr: logs}
	runtime := func(cfg *sandkeep.Config) { // the runsc pass reaches the in-process service too
		if rt := testRuntime(); rt != "" {
			cfg.Runtime = rt
		}
	}
	svc, err := g.openService(bounded(t), serverConfig{}, admissionFlags{trust: "trusted"}, files.Limits{}, runtime)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := svc.Close(); err != nil {
			t.Errorf("close the service: %v", err)
		}
		if t.Failed() {
			t.Logf("service log:\n%s", logs)
		}
	})
	srv := mcpserver.New(svc.backend, keyOf(t, tenant, "alice"), mcpserver.Options{Version: "test"})
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(bounded(t), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs := mcpConnect(t, ct)
	t.Cleanup(func() {
		_ = cs.Close()
		_ = ss.Wait()
	})
	execs := mcpExercise(t, cs, tenant, "alice")

	out := mcpOut[mcpserver.ExecOutput](t, mcpCall(t, cs, mcpserver.ToolExec, map[string]any{"argv": []string{"sleep", "60"}, "timeout_seconds": 1}))
	if !out.TimedOut || out.ExitCode != 124 {
		t.Errorf("a command past its timeout: %+v", out)
	}
	execs++

	// Cancelling a call kills the command's process tree.
	started := filepath.Join(c.workspace(t, tenant, "alice"), "started")
	ctx, cancel := context.WithCancel(bounded(t))
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpserver.ToolExec, Arguments: map[string]any{
			"command": "sleep 301 & sleep 302 & touch /workspace/started; wait"}})
		done <- err
	}()
	for {
		if _, err := os.Stat(started); err == nil {
			break
		}
		select {
		case err := <-done:
			cancel()
			t.Fatalf("the call ended before its command started: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled call returned %v, want context.Canceled", err)
	}
	execs++
	const bound = 30 * time.Second
	deadline := time.Now().Add(bound)
	for {
		out := mcpOut[mcpserver.ExecOutput](t, mcpCall(t, cs, mcpserver.ToolExec, map[string]any{"argv": []string{"ps", "-o", "pid,args"}}))
		execs++
		if !strings.Contains(out.Stdout, "ps -o pid,args") {
			t.Fatalf("ps does not list its own arguments: %+v", out)
		}
		if !regexp.MustCompile(`sleep 30[12]`).MatchString(out.Stdout) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after the call was cancelled, its processes still run:\n%s", bound, out.Stdout)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Every command was recorded in the store the service opened.
	runs, err := svc.st.ListRuns(bounded(t), store.RunFilter{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != execs {
		t.Errorf("%d runs recorded, want %d (one per command)", len(runs), execs)
	}
	for _, r := range runs {
		if r.User != "alice" || r.Driver != "docker" {
			t.Errorf("run %+v", r)
		}
	}
}
