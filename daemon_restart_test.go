package sandkeep_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestDaemonRestart: a long-lived manager survives a restart of the Docker daemon (which stops every container:
// live-restore is off): the next command starts the same sandbox again, with its workspace, and the agent channel
// comes back. It restarts the daemon, so it runs only when asked (SANDKEEP_TEST_DAEMON_RESTART=1), alone, in
// its own phase of scripts/test.sh.
func TestDaemonRestart(t *testing.T) {
	if os.Getenv("SANDKEEP_TEST_DAEMON_RESTART") != "1" {
		t.Skip("restarts the Docker daemon: set SANDKEEP_TEST_DAEMON_RESTART=1 (scripts/test.sh does, in a phase of its own)")
	}
	cfg := baseConfig(t)
	cfg.Transport = "auto"
	s := newSuite(t, cfg)
	key := s.key("acme", "restart")
	first := s.exec(s.m, key, "sh", "-c", "echo kept > /workspace/f")
	if first.Transport != "agent" {
		t.Logf("first command over %s", first.Transport)
	}

	restartDaemon(t)

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := s.m.Exec(ctx, key, sandkeep.ExecRequest{Argv: []string{"cat", "/workspace/f"}})
	if err != nil {
		t.Fatalf("first command after the restart: %v", err)
	}
	if strings.TrimSpace(res.Stdout) != "kept" || res.Sandbox.ID != first.Sandbox.ID {
		t.Fatalf("after the restart: %q in %s, want the workspace file in the same sandbox %s", res.Stdout, res.Sandbox.ID, first.Sandbox.ID)
	}
	// The channel comes back: within a few commands they run over the agent again.
	deadline := time.Now().Add(30 * time.Second)
	for {
		res := s.exec(s.m, key, "true")
		if res.Transport == "agent" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent channel did not come back after the restart (last transport %s)", res.Transport)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// restartDaemon stops dockerd with SIGTERM and starts it again with scripts/docker-up.sh.
func restartDaemon(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile("/var/run/docker.pid")
	if err != nil {
		t.Fatalf("dockerd pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("dockerd pid %q: %v", b, err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("stop dockerd: %v", err)
	}
	for i := 0; syscall.Kill(pid, 0) == nil; i++ {
		if i > 600 {
			t.Fatal("dockerd did not stop within 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	up := exec.Command("bash", filepath.Join(root, "scripts", "docker-up.sh"))
	if out, err := up.CombinedOutput(); err != nil {
		t.Fatalf("docker-up.sh: %v\n%s", err, out)
	}
}
