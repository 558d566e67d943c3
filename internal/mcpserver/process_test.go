package mcpserver

import (
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/api/apitest"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestProcessTools: start_process starts a background process of the session's own sandbox and answers its
// pid; list_processes, process_input, process_output and kill_process act on it by pid or tag; a backend
// without processes answers PROCESS_UNAVAILABLE; the scopes are exec's (list: read).
func TestProcessTools(t *testing.T) {
	b := apitest.NewBackend(t.TempDir())
	alice := mustKey(t, "acme", "alice")
	cs := connect(t, New(b, alice, Options{ResultLimit: 8}))
	p := output[ProcessInfo](t, call(t, cs, ToolStartProcess, map[string]any{"command": "npm run dev", "tag": "dev", "stdin": true}))
	if p.PID <= 0 || !p.Running || p.Tag != "dev" || strings.Join(p.Argv, " ") != "sh -c npm run dev" {
		t.Fatalf("start_process: %+v", p)
	}
	list := output[ProcessList](t, call(t, cs, ToolProcesses, map[string]any{}))
	if len(list.Processes) != 1 || list.Processes[0].PID != p.PID {
		t.Fatalf("list_processes: %+v", list)
	}
	output[Done](t, call(t, cs, ToolProcessInput, map[string]any{"tag": "dev", "data": "hello\n", "close": true}))
	out := output[ProcessOutput](t, call(t, cs, ToolProcessOut, map[string]any{"pid": p.PID}))
	// The fake's output is "started: ARGV\n" then the input: the result keeps its last 8 bytes.
	if out.Stdout != " closed\n" || !out.StdoutTruncated || !out.Running {
		t.Fatalf("process_output: %+v", out)
	}
	output[Done](t, call(t, cs, ToolKillProcess, map[string]any{"tag": "dev"}))
	out = output[ProcessOutput](t, call(t, cs, ToolProcessOut, map[string]any{"tag": "dev", "wait_seconds": 5}))
	if out.Running || !out.Killed {
		t.Fatalf("after kill_process: %+v", out)
	}
	wantCode(t, call(t, cs, ToolKillProcess, map[string]any{"tag": "dev"}), fault.ProcessExited)
	wantCode(t, call(t, cs, ToolKillProcess, map[string]any{"pid": 999}), fault.ProcessNotFound)
	wantCode(t, call(t, cs, ToolKillProcess, map[string]any{}), fault.InvalidArgument)

	// Another session's key does not see alice's process.
	bob := connect(t, New(b, mustKey(t, "acme", "bob"), Options{}))
	if l := output[ProcessList](t, call(t, bob, ToolProcesses, map[string]any{})); len(l.Processes) != 0 {
		t.Fatalf("bob lists %+v", l)
	}
	wantCode(t, call(t, bob, ToolKillProcess, map[string]any{"pid": p.PID}), fault.ProcessNotFound)

	plain := connect(t, New(newFakeBackend(t), alice, Options{}))
	wantCode(t, call(t, plain, ToolStartProcess, map[string]any{"command": "true"}), fault.ProcessUnavailable)
	if Scope(ToolStartProcess) != "exec" || Scope(ToolKillProcess) != "exec" || Scope(ToolProcesses) != "read" {
		t.Errorf("scopes: %s %s %s", Scope(ToolStartProcess), Scope(ToolKillProcess), Scope(ToolProcesses))
	}
}
