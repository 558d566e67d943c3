package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/mcpserver"
)

// TestServeProcessesMCP: through MCP on a real server, as a model calls the tools: start_process starts a
// dev server that runs on while exec commands run beside it; list_processes lists it, process_input writes to
// it, process_output reads what it wrote, kill_process ends it (listed as killed); another tenant's session
// finds nothing of it. Where the engine has no processes the start answers PROCESS_UNAVAILABLE.
func TestServeProcessesMCP(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	s := c.startServer(t)
	tok := c.createToken(t, c.ten("acme"), "mcp-procs", "").Token
	cs, err := s.mcpHTTP(t, map[string]string{"Authorization": "Bearer " + tok, "Sandkeep-User": "alice"})
	if err != nil {
		t.Fatal(err)
	}
	start := map[string]any{"command": "echo ready; while read l; do echo got $l; done; echo closed; sleep 600",
		"tag": "dev", "stdin": true, "lifetime_seconds": 600}
	if !c.processesServed() {
		res := mcpCall(t, cs, mcpserver.ToolStartProcess, start)
		if !res.IsError || !strings.HasPrefix(mcpText(res), string(fault.ProcessUnavailable)) {
			t.Fatalf("start_process where the engine has no processes: %s", mcpText(res))
		}
		return
	}
	p := mcpOut[mcpserver.ProcessInfo](t, mcpCall(t, cs, mcpserver.ToolStartProcess, start))
	if p.PID <= 0 || !p.Running || p.Tag != "dev" || !p.Stdin {
		t.Fatalf("start_process: %+v", p)
	}
	for range 2 { // commands beside it, each at once
		out := mcpOut[mcpserver.ExecOutput](t, mcpCall(t, cs, mcpserver.ToolExec, map[string]any{"command": "echo beside", "timeout_seconds": 30}))
		if out.ExitCode != 0 || out.Stdout != "beside\n" {
			t.Fatalf("exec beside the process: %+v", out)
		}
	}
	ls := mcpOut[mcpserver.ProcessList](t, mcpCall(t, cs, mcpserver.ToolProcesses, map[string]any{}))
	if len(ls.Processes) != 1 || ls.Processes[0].PID != p.PID || !ls.Processes[0].Running {
		t.Fatalf("list_processes: %+v", ls)
	}
	mcpOut[mcpserver.Done](t, mcpCall(t, cs, mcpserver.ToolProcessInput, map[string]any{"tag": "dev", "data": "one\n", "close": true}))
	var out mcpserver.ProcessOutput
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		out = mcpOut[mcpserver.ProcessOutput](t, mcpCall(t, cs, mcpserver.ToolProcessOut, map[string]any{"pid": p.PID}))
		if out.Stdout == "ready\ngot one\nclosed\n" {
			break
		}
	}
	if out.Stdout != "ready\ngot one\nclosed\n" || !out.Running {
		t.Fatalf("process_output: %+v", out)
	}

	other := c.createToken(t, c.ten("globex"), "mcp-procs", "").Token
	ocs, err := s.mcpHTTP(t, map[string]string{"Authorization": "Bearer " + other, "Sandkeep-User": "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if l := mcpOut[mcpserver.ProcessList](t, mcpCall(t, ocs, mcpserver.ToolProcesses, map[string]any{})); len(l.Processes) != 0 {
		t.Errorf("another tenant lists %+v", l)
	}
	if res := mcpCall(t, ocs, mcpserver.ToolKillProcess, map[string]any{"pid": p.PID}); !res.IsError {
		t.Errorf("another tenant's kill_process succeeded: %s", mcpText(res))
	}

	mcpOut[mcpserver.Done](t, mcpCall(t, cs, mcpserver.ToolKillProcess, map[string]any{"tag": "dev"}))
	out = mcpOut[mcpserver.ProcessOutput](t, mcpCall(t, cs, mcpserver.ToolProcessOut, map[string]any{"pid": p.PID, "wait_seconds": 30}))
	if out.Running || !out.Killed {
		t.Fatalf("after kill_process: %+v", out)
	}
}
