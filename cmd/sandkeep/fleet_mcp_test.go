package main

import (
	"strings"
	"testing"

	sdk "github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/fleet"
	"github.com/sandkeep/sandkeep/internal/mcpserver"
	"github.com/sandkeep/sandkeep/internal/store/postgres"
)

// TestFleetMCP: an MCP session opened on the replica that does not own its key (the token's tenant, the
// Sandkeep-User header's user) is served by the owner, the whole session handed over: the file tools, which a
// replica serves only for keys it owns, and processes work through either replica, and the key's lease never
// moves.
func TestFleetMCP(t *testing.T) {
	c, reps, dsn := twoReplicas(t)
	tenant := c.ten("fmcp")
	tok := c.createToken(t, tenant, "fmcp", "")
	owner := reps[0].client(t, tok.Token)
	if res, err := owner.Exec(bounded(t), "alice", sdk.ExecRequest{Command: "echo owned > /workspace/owned.txt"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec on the owner: %+v %v", res, err)
	}
	st, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lease := fleet.LeaseName(keyOf(t, tenant, "alice"))
	before, err := st.GetLease(t.Context(), lease)
	if err != nil || !strings.Contains(reps[0].log.String(), "fleet replica "+before.Owner+",") {
		t.Fatalf("lease %+v, %v: want replica 0's", before, err)
	}

	cs, err := reps[1].mcpHTTP(t, map[string]string{"Authorization": "Bearer " + tok.Token, "Sandkeep-User": "alice"})
	if err != nil {
		t.Fatalf("an MCP session through the replica that does not own the key: %v", err)
	}
	read := mcpOut[mcpserver.ReadFileOutput](t, mcpCall(t, cs, mcpserver.ToolReadFile, map[string]any{"path": "owned.txt"}))
	if read.Content != "owned\n" {
		t.Fatalf("read_file through the other replica: %+v", read)
	}
	mcpOut[mcpserver.WriteFileOutput](t, mcpCall(t, cs, mcpserver.ToolWriteFile, map[string]any{"path": "via-mcp.txt", "content": "written over MCP\n"}))
	out := mcpOut[mcpserver.ExecOutput](t, mcpCall(t, cs, mcpserver.ToolExec, map[string]any{"command": "cat via-mcp.txt", "timeout_seconds": 30}))
	if out.ExitCode != 0 || out.Stdout != "written over MCP\n" {
		t.Fatalf("exec through the other replica's MCP: %+v", out)
	}
	if c.processesServed() {
		p := mcpOut[mcpserver.ProcessInfo](t, mcpCall(t, cs, mcpserver.ToolStartProcess, map[string]any{"command": "sleep 600", "tag": "dev"}))
		ls := mcpOut[mcpserver.ProcessList](t, mcpCall(t, cs, mcpserver.ToolProcesses, map[string]any{}))
		if len(ls.Processes) != 1 || ls.Processes[0].PID != p.PID {
			t.Fatalf("list_processes through the other replica: %+v; want %d", ls, p.PID)
		}
		mcpOut[mcpserver.Done](t, mcpCall(t, cs, mcpserver.ToolKillProcess, map[string]any{"pid": p.PID}))
	}
	if got, err := owner.Exec(bounded(t), "alice", sdk.ExecRequest{Command: "cat /workspace/via-mcp.txt"}); err != nil || got.Stdout != "written over MCP\n" {
		t.Fatalf("the owner's sandbox does not hold the file MCP wrote: %+v %v", got, err)
	}
	after, err := st.GetLease(t.Context(), lease)
	if err != nil || after.Owner != before.Owner || after.Token != before.Token {
		t.Fatalf("the key's lease moved: %+v -> %+v (%v)", before, after, err)
	}
}
