package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/testutil"
)

// tsClientDir is test/mcp-ts: the official TypeScript MCP client (@modelcontextprotocol/sdk) and its script.
func tsClientDir(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "test", "mcp-ts")
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is not installed (scripts/test.sh installs the TypeScript client's dependencies with it): %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Fatalf("the TypeScript MCP client is not installed: run `npm ci` in test/mcp-ts (scripts/test.sh does): %v", err)
	}
	return dir
}

// runTSClient runs the TypeScript client script with args and fails the test unless every check passed.
func runTSClient(t *testing.T, dir string, env []string, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(bounded(t), "node", append([]string{"client.mjs"}, args...)...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	t.Logf("TypeScript client %s:\n%s", args[0], out)
	if err != nil || strings.Contains(string(out), "FAIL") {
		t.Errorf("the TypeScript MCP client failed against %s: %v", args[0], err)
	}
}

// TestMCPTypeScript runs the official TypeScript MCP client, the library most MCP hosts are built on, against
// `sandkeep mcp` (stdio) and a server's /mcp: it lists the tools, calls each (the client checks structured content
// against each tool's output schema), and makes refused calls whose error text must reach it as a result.
func TestMCPTypeScript(t *testing.T) {
	t.Parallel()
	testutil.Docker(t) // before the client's check: a run without Docker (the short tier) skips it as a Docker test
	dir := tsClientDir(t)
	c := newCLI(t)
	tenant := c.ten("acme")

	mcpCmd := c.command(bounded(t), transportEnv(), "mcp", "--tenant", tenant, "--user", "ts-stdio")
	runTSClient(t, dir, mcpCmd.Env, append([]string{"stdio", mcpCmd.Path}, mcpCmd.Args[1:]...)...)

	s := c.startServer(t)
	tok := c.createToken(t, tenant, "ts-agent", "").Token
	runTSClient(t, dir, os.Environ(), "http", s.url+"/mcp", "Authorization=Bearer "+tok, "Sandkeep-User=ts-http")
}
