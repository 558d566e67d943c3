package mcpserver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkeep/sandkeep"
)

// stdioChildEnv, set to a directory, makes the test binary serve MCP over its stdin and stdout with a fake
// backend whose workspaces live in that directory (see TestMain).
const stdioChildEnv = "SANDKEEP_MCPSERVER_STDIO_CHILD"

func stdioChild() int {
	b := &fakeBackend{dir: os.Getenv(stdioChildEnv), sandboxes: map[string]sandkeep.Sandbox{}}
	b.execFn = func(_ context.Context, key sandkeep.Key, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
		return &sandkeep.ExecResult{ExitCode: 2, Stdout: key.Tenant + "/" + key.User + ": " + strings.Join(req.Argv, " ")}, nil
	}
	key, err := sandkeep.NewKey("acme", "alice")
	if err == nil {
		err = ServeStdio(context.Background(), b, key, Options{})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestStdio runs the server as a real subprocess speaking over its stdin and stdout, as `sandkeep mcp` does.
func TestStdio(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), stdioChildEnv+"="+t.TempDir())
	cmd.Stderr = os.Stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).
		Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if init := cs.InitializeResult(); init.ServerInfo.Name != "sandkeep" || init.Instructions == "" {
		t.Errorf("server info %+v, instructions %q", init.ServerInfo, init.Instructions)
	}
	out := output[ExecOutput](t, call(t, cs, ToolExec, map[string]any{"command": "echo hi"}))
	if out.ExitCode != 2 || out.Stdout != "acme/alice: sh -c echo hi" {
		t.Errorf("exec over stdio %+v", out)
	}
	output[WriteFileOutput](t, call(t, cs, ToolWriteFile, map[string]any{"path": "a/b.txt", "content": "x"}))
	if r := output[ReadFileOutput](t, call(t, cs, ToolReadFile, map[string]any{"path": "a/b.txt"})); r.Content != "x" {
		t.Errorf("read %+v", r)
	}
	toolError(t, call(t, cs, ToolReadFile, map[string]any{"path": "../../x"}))
	if err := cs.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Errorf("server process ended %v; want a clean exit when the client disconnects", cmd.ProcessState)
	}
}
