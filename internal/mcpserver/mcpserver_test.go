package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
)

func TestMain(m *testing.M) {
	if os.Getenv(stdioChildEnv) != "" {
		os.Exit(stdioChild())
	}
	goleak.VerifyTestMain(m)
}

func mustKey(t testing.TB, tenant, user string) sandkeep.Key {
	t.Helper()
	k, err := sandkeep.NewKey(tenant, user)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// connect serves s over an in-memory transport and returns a client session to it.
func connect(t *testing.T, s *mcp.Server) *mcp.ClientSession {
	t.Helper()
	ct, st := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.Close()
		_ = ss.Wait()
	})
	return cs
}

// setup returns a fake backend and a client of a server bound to acme/alice over it.
func setup(t *testing.T, opts Options) (*fakeBackend, *mcp.ClientSession, sandkeep.Key) {
	t.Helper()
	b := newFakeBackend(t)
	key := mustKey(t, "acme", "alice")
	return b, connect(t, New(b, key, opts)), key
}

func call(t *testing.T, cs *mcp.ClientSession, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: a tool call failed as a protocol error, not a tool result: %v", tool, err)
	}
	return res
}

// output decodes a successful call's structured content, and checks the text content says the same.
func output[T any](t *testing.T, res *mcp.CallToolResult) T {
	t.Helper()
	if res.IsError {
		t.Fatalf("call failed: %s", text(res))
	}
	var out T
	remarshal(t, res.StructuredContent, &out)
	var fromText T
	if err := json.Unmarshal([]byte(text(res)), &fromText); err != nil {
		t.Fatalf("text content is not the structured content as JSON: %v\n%s", err, text(res))
	}
	return out
}

// toolError checks res is a tool error whose text and _meta error agree, with no structured content (which would
// have to match the tool's output schema), and returns it.
func toolError(t *testing.T, res *mcp.CallToolResult) ToolError {
	t.Helper()
	if !res.IsError {
		t.Fatalf("call succeeded, want a tool error: %s", text(res))
	}
	if res.StructuredContent != nil {
		t.Fatalf("a tool error carries structured content %v, which clients check against the output schema", res.StructuredContent)
	}
	var te ToolError
	remarshal(t, res.Meta[ErrorMetaKey], &te)
	if te.Code == "" || te.Message == "" {
		t.Fatalf("_meta %v lacks the error's code or message", res.Meta)
	}
	if got := text(res); got != te.String() {
		t.Fatalf("text %q, want %q", got, te.String())
	}
	return te
}

func wantCode(t *testing.T, res *mcp.CallToolResult, code fault.Code) ToolError {
	t.Helper()
	te := toolError(t, res)
	if te.Code != code {
		t.Fatalf("code %s (%s), want %s", te.Code, te, code)
	}
	return te
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func remarshal(t *testing.T, from, to any) {
	t.Helper()
	data, err := json.Marshal(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, to); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
}

func TestToolsAndSchemas(t *testing.T) {
	_, cs, _ := setup(t, Options{})
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	byName := map[string]*mcp.Tool{}
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
		byName[tool.Name] = tool
	}
	slices.Sort(names)
	want := []string{ToolCreateSnapshot, ToolDeleteSnapshot, ToolExec, ToolFork, ToolKillProcess, ToolListFiles, ToolProcesses,
		ToolListSnapshots, ToolProcessInput, ToolProcessOut, ToolReadFile, ToolRestoreSnapshot, ToolSandboxStatus,
		ToolStartProcess, ToolWriteFile}
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}

	type schema struct {
		Type                 any                `json:"type"` // a name, or a list of names
		Properties           map[string]*schema `json:"properties"`
		Required             []string           `json:"required"`
		AdditionalProperties any                `json:"additionalProperties"` // false, or a schema
		Description          string             `json:"description"`
		Minimum, Maximum     *float64
		Default              any      `json:"default"`
		Enum                 []string `json:"enum"`
		MaxItems             *int     `json:"maxItems"`
		Pattern              string   `json:"pattern"`
	}
	decode := func(name, which string, v any) *schema {
		var s schema
		remarshal(t, v, &s)
		if s.Type != "object" {
			t.Fatalf("%s %s schema type %q, want object", name, which, s.Type)
		}
		for p, ps := range s.Properties {
			if ps.Description == "" {
				t.Errorf("%s %s property %s has no description", name, which, p)
			}
		}
		return &s
	}
	for _, name := range want {
		tool := byName[name]
		if tool.Description == "" {
			t.Errorf("%s has no description", name)
		}
		in := decode(name, "input", tool.InputSchema)
		if in.AdditionalProperties != false {
			t.Errorf("%s input schema allows unknown properties", name)
		}
		if tool.OutputSchema == nil {
			t.Errorf("%s has no output schema", name)
			continue
		}
		decode(name, "output", tool.OutputSchema)
	}

	exec := decode(ToolExec, "input", byName[ToolExec].InputSchema)
	ts := exec.Properties["timeout_seconds"]
	if ts == nil || ts.Minimum == nil || *ts.Minimum != 1 || ts.Maximum == nil || *ts.Maximum != 3600 || ts.Default != 120.0 {
		t.Errorf("timeout_seconds schema %+v, want minimum 1, maximum 3600, default 120", ts)
	}
	if len(exec.Required) != 0 {
		t.Errorf("exec requires %v; command, argv and the rest are each optional", exec.Required)
	}
	if exec.Properties["argv"].MaxItems == nil {
		t.Error("argv has no maxItems")
	}
	out := decode(ToolExec, "output", byName[ToolExec].OutputSchema)
	for _, f := range []string{"exit_code", "timed_out", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "duration_ms"} {
		if !slices.Contains(out.Required, f) {
			t.Errorf("exec output does not always carry %s", f)
		}
	}
	write := decode(ToolWriteFile, "input", byName[ToolWriteFile].InputSchema)
	if !slices.Equal(write.Properties["encoding"].Enum, []string{"utf-8", "base64"}) {
		t.Errorf("write_file encoding enum %v", write.Properties["encoding"].Enum)
	}
	if !slices.Equal(slices.Sorted(slices.Values(write.Required)), []string{"content", "path"}) {
		t.Errorf("write_file requires %v, want content and path", write.Required)
	}
	if !byName[ToolReadFile].Annotations.ReadOnlyHint || byName[ToolWriteFile].Annotations.ReadOnlyHint {
		t.Error("read_file should be marked read-only and write_file not")
	}
}

func TestExec(t *testing.T) {
	tests := []struct {
		name      string
		args      map[string]any
		wantArgv  []string
		wantEnv   []string
		wantTime  time.Duration
		wantStdin string
		wantDir   string
	}{
		{name: "command runs with sh -c, default timeout",
			args:     map[string]any{"command": "echo hi | tr a-z A-Z"},
			wantArgv: []string{"sh", "-c", "echo hi | tr a-z A-Z"}, wantTime: 120 * time.Second},
		{name: "argv runs as given",
			args:     map[string]any{"argv": []string{"ls", "-la", "a b"}, "workdir": "src", "timeout_seconds": 5},
			wantArgv: []string{"ls", "-la", "a b"}, wantTime: 5 * time.Second, wantDir: "src"},
		{name: "env sorted by name, stdin passed",
			args:     map[string]any{"command": "cat", "env": map[string]string{"B": "2", "A": "x=y"}, "stdin": "input\n"},
			wantArgv: []string{"sh", "-c", "cat"}, wantEnv: []string{"A=x=y", "B=2"}, wantTime: 120 * time.Second,
			wantStdin: "input\n"},
		{name: "largest timeout",
			args:     map[string]any{"argv": []string{"sleep", "1"}, "timeout_seconds": 3600},
			wantArgv: []string{"sleep", "1"}, wantTime: time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, cs, key := setup(t, Options{OutputLimit: 4096})
			out := output[ExecOutput](t, call(t, cs, ToolExec, tt.args))
			if out.Stdout != "ok\n" {
				t.Errorf("stdout %q", out.Stdout)
			}
			calls := b.calls()
			if len(calls) != 1 {
				t.Fatalf("%d execs, want 1", len(calls))
			}
			c := calls[0]
			if c.key != key {
				t.Errorf("ran for %v, want %v", c.key, key)
			}
			if !slices.Equal(c.req.Argv, tt.wantArgv) || !slices.Equal(c.req.Env, tt.wantEnv) ||
				c.req.Timeout != tt.wantTime || c.stdin != tt.wantStdin || c.req.Workdir != tt.wantDir {
				t.Errorf("request argv %q env %q timeout %v stdin %q workdir %q, want %q %q %v %q %q",
					c.req.Argv, c.req.Env, c.req.Timeout, c.stdin, c.req.Workdir,
					tt.wantArgv, tt.wantEnv, tt.wantTime, tt.wantStdin, tt.wantDir)
			}
			if c.req.OutputLimit != 4096 {
				t.Errorf("output limit %d, want the server's 4096", c.req.OutputLimit)
			}
		})
	}
}

func TestExecResults(t *testing.T) {
	tests := []struct {
		name string
		res  *sandkeep.ExecResult
		err  error
		want ExecOutput
		code fault.Code // a tool error with this code instead
	}{
		{name: "non-zero exit is a normal result",
			res:  &sandkeep.ExecResult{ExitCode: 3, Stdout: "out", Stderr: "boom", DurationMS: 12},
			want: ExecOutput{ExitCode: 3, Stdout: "out", Stderr: "boom", DurationMS: 12}},
		{name: "timeout is a normal result",
			res:  &sandkeep.ExecResult{ExitCode: 124, TimedOut: true, StdoutTruncated: true, StderrTruncated: true},
			want: ExecOutput{ExitCode: 124, TimedOut: true, StdoutTruncated: true, StderrTruncated: true}},
		{name: "sandkeep failure is a tool error with its code",
			err:  fault.New(fault.SandboxBusy, "retry in a moment", "another command holds alice's sandbox"),
			code: fault.SandboxBusy},
		{name: "wrapped failure keeps its code",
			err:  fmtWrap(fault.New(fault.ImageUnavailable, "build it", "no image")),
			code: fault.ImageUnavailable},
		{name: "failure without a code is INTERNAL",
			err:  errors.New("dial unix /var/run/secret-host-path.sock: refused"),
			code: fault.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, cs, _ := setup(t, Options{})
			b.execFn = func(context.Context, sandkeep.Key, sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
				return tt.res, tt.err
			}
			res := call(t, cs, ToolExec, map[string]any{"command": "x"})
			if tt.code != "" {
				te := wantCode(t, res, tt.code)
				if strings.Contains(te.String(), "secret-host-path") {
					t.Errorf("an internal cause reached the client: %s", te)
				}
				if fe := (*fault.Error)(nil); errors.As(tt.err, &fe) && (te.Message != fe.Message || te.Hint != fe.Hint) {
					t.Errorf("tool error %+v, want message %q hint %q", te, fe.Message, fe.Hint)
				}
				return
			}
			if got := output[ExecOutput](t, res); got != tt.want {
				t.Errorf("output %+v, want %+v", got, tt.want)
			}
		})
	}
}

func fmtWrap(err error) error { return errors.Join(errors.New("exec"), err) }

func TestToolErrorText(t *testing.T) {
	_, cs, _ := setup(t, Options{})
	res := call(t, cs, ToolExec, map[string]any{})
	te := wantCode(t, res, fault.InvalidArgument)
	want := "INVALID_ARGUMENT: no command to run (hint: give command (a shell line) or argv (a program and its arguments))"
	if text(res) != want || te.Hint == "" {
		t.Errorf("text %q, want %q", text(res), want)
	}
}

func TestExecRefused(t *testing.T) {
	manyEnv := map[string]string{}
	for i := range MaxEnvVars + 1 {
		manyEnv["V"+strings.Repeat("x", i)] = "1"
	}
	bigEnv := map[string]string{}
	for i := range 9 {
		bigEnv["V"+strings.Repeat("x", i)] = strings.Repeat("v", 120<<10)
	}
	tests := []struct {
		name string
		args map[string]any
		code fault.Code
	}{
		{"nothing to run", map[string]any{}, fault.InvalidArgument},
		{"both command and argv", map[string]any{"command": "ls", "argv": []string{"ls"}}, fault.InvalidArgument},
		{"empty program", map[string]any{"argv": []string{"", "x"}}, fault.InvalidArgument},
		{"command too long", map[string]any{"command": strings.Repeat("a", MaxCommandBytes+1)}, fault.InvalidArgument},
		{"NUL in command", map[string]any{"command": "echo a\x00b"}, fault.InvalidArgument},
		{"NUL in argv", map[string]any{"argv": []string{"echo", "a\x00"}}, fault.InvalidArgument},
		{"too many args", map[string]any{"argv": slices.Repeat([]string{"x"}, MaxArgs+1)}, fault.InvalidArgument},
		{"timeout zero", map[string]any{"command": "ls", "timeout_seconds": 0}, fault.InvalidArgument},
		{"timeout too long", map[string]any{"command": "ls", "timeout_seconds": 7200}, fault.InvalidArgument},
		{"timeout not a number", map[string]any{"command": "ls", "timeout_seconds": "soon"}, fault.InvalidArgument},
		{"too many env vars", map[string]any{"command": "ls", "env": manyEnv}, fault.InvalidArgument},
		{"env name with =", map[string]any{"command": "ls", "env": map[string]string{"A=B": "1"}}, fault.InvalidEnv},
		{"env value with NUL", map[string]any{"command": "ls", "env": map[string]string{"A": "\x00"}}, fault.InvalidEnv},
		{"command and env too large", map[string]any{"command": "ls", "env": bigEnv}, fault.InvalidArgument},
		{"stdin too large", map[string]any{"command": "cat", "stdin": strings.Repeat("a", MaxStdinBytes+1)}, fault.InvalidArgument},
		{"workdir too long", map[string]any{"command": "ls", "workdir": strings.Repeat("d", MaxPathBytes+1)}, fault.InvalidArgument},
		{"unknown field", map[string]any{"command": "ls", "cwd": "/tmp"}, fault.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, cs, _ := setup(t, Options{})
			wantCode(t, call(t, cs, ToolExec, tt.args), tt.code)
			if n := len(b.calls()); n != 0 {
				t.Errorf("a refused request reached the backend (%d execs)", n)
			}
		})
	}
}

// TestExecRequestTimeout covers what the schema cannot stop for a Go caller of execRequest: the bounds
// themselves.
func TestExecRequestTimeout(t *testing.T) {
	for _, ts := range []int{-1, MaxTimeout + 1} {
		_, err := execRequest(ExecInput{Command: "ls", TimeoutSeconds: ts}, 0)
		if fault.CodeOf(err) != fault.InvalidTimeout {
			t.Errorf("timeout %d: %v, want INVALID_TIMEOUT", ts, err)
		}
	}
}

func TestNoKey(t *testing.T) {
	b := newFakeBackend(t)
	cs := connect(t, New(b, sandkeep.Key{}, Options{}))
	wantCode(t, call(t, cs, ToolExec, map[string]any{"command": "ls"}), fault.InvalidIdentity)
	wantCode(t, call(t, cs, ToolSandboxStatus, map[string]any{}), fault.InvalidIdentity)
	if len(b.calls()) != 0 {
		t.Error("a server without a key reached the backend")
	}
	if err := ServeStdio(context.Background(), b, sandkeep.Key{}, Options{}); fault.CodeOf(err) != fault.InvalidIdentity {
		t.Errorf("ServeStdio without a key: %v, want INVALID_IDENTITY", err)
	}
}

func TestFiles(t *testing.T) {
	b, cs, key := setup(t, Options{})
	// A new user has no workspace yet: reading says so, writing creates it.
	wantCode(t, call(t, cs, ToolReadFile, map[string]any{"path": "a.txt"}), fault.NotFound)

	w := output[WriteFileOutput](t, call(t, cs, ToolWriteFile, map[string]any{"path": "src/a.txt", "content": "héllo\n"}))
	if w.Bytes != int64(len("héllo\n")) {
		t.Errorf("wrote %d bytes, want %d", w.Bytes, len("héllo\n"))
	}
	r := output[ReadFileOutput](t, call(t, cs, ToolReadFile, map[string]any{"path": "/workspace/src/a.txt"}))
	if r.Encoding != "utf-8" || r.Content != "héllo\n" || r.Size != 7 {
		t.Errorf("read %+v", r)
	}
	onDisk, err := os.ReadFile(filepath.Join(b.wsDir(key), "src", "a.txt"))
	if err != nil || string(onDisk) != "héllo\n" {
		t.Errorf("on disk %q, %v", onDisk, err)
	}

	binary := []byte{0, 1, 2, 0xff, 0xfe, 'x'}
	output[WriteFileOutput](t, call(t, cs, ToolWriteFile, map[string]any{"path": "bin/blob", "mode": "0755",
		"content": base64.StdEncoding.EncodeToString(binary), "encoding": "base64"}))
	r = output[ReadFileOutput](t, call(t, cs, ToolReadFile, map[string]any{"path": "bin/blob"}))
	got, err := base64.StdEncoding.DecodeString(r.Content)
	if r.Encoding != "base64" || err != nil || string(got) != string(binary) {
		t.Errorf("binary read back as %+v (%v)", r, err)
	}
	fi, err := os.Stat(filepath.Join(b.wsDir(key), "bin", "blob"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("mode %v (%v), want 0755", fi.Mode(), err)
	}

	output[WriteFileOutput](t, call(t, cs, ToolWriteFile, map[string]any{"path": "empty", "content": ""}))
	r = output[ReadFileOutput](t, call(t, cs, ToolReadFile, map[string]any{"path": "empty"}))
	if r.Size != 0 || r.Content != "" || r.Encoding != "utf-8" {
		t.Errorf("empty file read as %+v", r)
	}

	l := output[ListFilesOutput](t, call(t, cs, ToolListFiles, map[string]any{}))
	var names []string
	for _, e := range l.Entries {
		names = append(names, e.Name+":"+e.Type)
	}
	if !slices.Equal(names, []string{"bin:dir", "empty:file", "src:dir"}) || l.Truncated {
		t.Errorf("listing %v (truncated %v)", names, l.Truncated)
	}
	l = output[ListFilesOutput](t, call(t, cs, ToolListFiles, map[string]any{"path": "src"}))
	if len(l.Entries) != 1 || l.Entries[0].Name != "a.txt" || l.Entries[0].Size != 7 || l.Entries[0].Mode != "0644" ||
		l.Entries[0].MTime.IsZero() {
		t.Errorf("src listing %+v", l.Entries)
	}
}

func TestFilesRefused(t *testing.T) {
	b, cs, key := setup(t, Options{MaxReadBytes: 16, MaxWriteBytes: 16})
	output[WriteFileOutput](t, call(t, cs, ToolWriteFile, map[string]any{"path": "ok", "content": "0123456789abcdef"}))
	if err := os.WriteFile(filepath.Join(b.wsDir(key), "big"), make([]byte, 17), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(b.wsDir(key), "link")); err != nil {
		t.Fatal(err)
	}
	big := base64.StdEncoding.EncodeToString(make([]byte, 17))
	tests := []struct {
		name string
		tool string
		args map[string]any
		code fault.Code
	}{
		{"read past the bound", ToolReadFile, map[string]any{"path": "big"}, fault.FileTooLarge},
		{"read missing", ToolReadFile, map[string]any{"path": "nope"}, fault.FileNotFound},
		{"read a directory", ToolReadFile, map[string]any{"path": "."}, fault.FileType},
		{"read escaping", ToolReadFile, map[string]any{"path": "../../etc/passwd"}, fault.InvalidPath},
		{"read absolute outside", ToolReadFile, map[string]any{"path": "/etc/passwd"}, fault.InvalidPath},
		{"read through a symlink", ToolReadFile, map[string]any{"path": "link/passwd"}, fault.PathConflict},
		{"read without path", ToolReadFile, map[string]any{}, fault.InvalidArgument},
		{"read NUL path", ToolReadFile, map[string]any{"path": "a\x00b"}, fault.InvalidPath},
		{"write text past the bound", ToolWriteFile, map[string]any{"path": "x", "content": strings.Repeat("a", 17)}, fault.FileTooLarge},
		{"write base64 past the bound", ToolWriteFile, map[string]any{"path": "x", "content": big, "encoding": "base64"}, fault.FileTooLarge},
		{"write bad base64", ToolWriteFile, map[string]any{"path": "x", "content": "!!!", "encoding": "base64"}, fault.InvalidArgument},
		{"write unknown encoding", ToolWriteFile, map[string]any{"path": "x", "content": "a", "encoding": "latin1"}, fault.InvalidArgument},
		{"write setuid mode", ToolWriteFile, map[string]any{"path": "x", "content": "a", "mode": "4755"}, fault.InvalidArgument},
		{"write zero mode", ToolWriteFile, map[string]any{"path": "x", "content": "a", "mode": "0"}, fault.InvalidArgument},
		{"write escaping", ToolWriteFile, map[string]any{"path": "../x", "content": "a"}, fault.InvalidPath},
		{"write without content", ToolWriteFile, map[string]any{"path": "x"}, fault.InvalidArgument},
		{"list a file", ToolListFiles, map[string]any{"path": "ok"}, fault.FileType},
		{"list missing", ToolListFiles, map[string]any{"path": "nope"}, fault.FileNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantCode(t, call(t, cs, tt.tool, tt.args), tt.code)
		})
	}
	if _, err := os.Stat(filepath.Join(b.wsDir(key), "x")); err == nil {
		t.Error("a refused write left a file behind")
	}
}

func TestListTruncated(t *testing.T) {
	_, cs, _ := setup(t, Options{MaxListEntries: 2})
	for _, name := range []string{"a", "b", "c"} {
		output[WriteFileOutput](t, call(t, cs, ToolWriteFile, map[string]any{"path": name, "content": name}))
	}
	l := output[ListFilesOutput](t, call(t, cs, ToolListFiles, map[string]any{"path": "."}))
	if len(l.Entries) != 2 || l.Entries[0].Name != "a" || l.Entries[1].Name != "b" || !l.Truncated {
		t.Errorf("listing %+v truncated %v, want a, b and truncated", l.Entries, l.Truncated)
	}
}

func TestSandboxStatus(t *testing.T) {
	b, cs, key := setup(t, Options{})
	out := output[StatusOutput](t, call(t, cs, ToolSandboxStatus, map[string]any{}))
	if out.Exists || out.State != "none" || out.Message == "" || out.User != "alice" || out.Tenant != "acme" {
		t.Errorf("status before any sandbox %+v, want state none with a message", out)
	}

	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b.sandboxes[key.Hex()] = sandkeep.Sandbox{Tenant: "acme", User: "alice", Name: "sandkeep-u-abc", State: "running",
		Image: "debian:12", CreatedAt: created, LastUsed: created.Add(time.Minute), IdleFor: "1m0s"}
	out = output[StatusOutput](t, call(t, cs, ToolSandboxStatus, nil))
	want := StatusOutput{Exists: true, State: "running", Tenant: "acme", User: "alice", Name: "sandkeep-u-abc",
		Image: "debian:12", CreatedAt: created, LastUsed: created.Add(time.Minute), IdleFor: "1m0s"}
	if out != want {
		t.Errorf("status %+v, want %+v", out, want)
	}

	b.sbErr = fault.New(fault.DriverUnavailable, "start Docker", "cannot reach the engine")
	wantCode(t, call(t, cs, ToolSandboxStatus, nil), fault.DriverUnavailable)
}

func TestCancel(t *testing.T) {
	b, cs, _ := setup(t, Options{})
	started := make(chan struct{})
	cancelled := make(chan struct{})
	b.execFn = func(ctx context.Context, _ sandkeep.Key, _ sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
		close(started)
		<-ctx.Done()
		close(cancelled)
		return &sandkeep.ExecResult{ExitCode: 137}, ctx.Err()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: ToolExec, Arguments: map[string]any{"command": "sleep 100"}})
		done <- err
	}()
	<-started
	cancel()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("cancelling the call did not cancel the command")
	}
	if err := <-done; err == nil {
		t.Error("a cancelled call reported success")
	}
}
