package main

import (
	"bytes"
	"os"
	"os/exec"
	"testing"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
)

// TestFSBuiltin runs the shipped binary's `fs`: it works on /workspace and nowhere else (no flag, argument or
// variable moves it), answers a refusal with a file fault on stderr and exit 1, and a malformed operation with 2.
func TestFSBuiltin(t *testing.T) {
	if workspaceDir != driver.WorkspaceDir {
		t.Fatalf("agent workspaceDir %q != driver.WorkspaceDir %q", workspaceDir, driver.WorkspaceDir)
	}
	if _, err := os.Lstat(workspaceDir); err == nil {
		t.Skip("this host has a /workspace: the refusal below needs none")
	}
	run := func(args ...string) (int, string) {
		cmd := exec.Command(agentBin, append([]string{"fs"}, args...)...)
		cmd.Env = append(os.Environ(), "SANDKEEP_WORKSPACE="+t.TempDir())
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		_ = cmd.Run()
		return cmd.ProcessState.ExitCode(), stderr.String()
	}
	code, msg := run(`{"op":"stat","path":".","limits":{}}`)
	err := files.ParseReply([]byte(msg), "/workspace")
	if code != 1 || !fault.Is(err, fault.FileNotFound) {
		t.Errorf("stat of a missing /workspace: exit %d, %q (%v), want 1 and FILE_NOT_FOUND", code, msg, err)
	}
	for _, args := range [][]string{{}, {`{"op":"stat","path":"../etc","limits":{}}`}, {`{"op":"stat","path":".","limits":{}}`, "x"}} {
		if code, msg := run(args...); code != 2 {
			t.Errorf("fs %q: exit %d (%s), want 2", args, code, msg)
		}
	}
}
