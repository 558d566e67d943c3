package sandkeep_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/events"
)

// devcontainerRepo writes a repository whose sandkeep.yaml names no image, so its devcontainer.json decides.
func devcontainerRepo(t *testing.T, dc string) string {
	t.Helper()
	repo := t.TempDir()
	if err := os.MkdirAll(filepath.Join(repo, ".devcontainer"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, ".devcontainer", "devcontainer.json"), []byte(dc), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(repo, "sandkeep.yaml")
	if err := os.WriteFile(spec, []byte("sandbox:\n  mode: inline\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return spec
}

// TestDevcontainerAsWritten runs a devcontainer.json the way real repositories write it, against the real
// engine: the posture-weakening options it asks for (--privileged, --cap-add=SYS_PTRACE, seccomp off, the
// Docker socket) are dropped and reported, leaving CapEff 0; the workspace is at workspaceFolder
// /workspaces/app, where commands start, where the workdir guard and the file API follow it; a named volume
// survives the sandbox's removal and recreation and goes with `rm`; postStartCommand runs again after a stop
// while onCreateCommand and postCreateCommand run once, and postAttachCommand runs before each run's first command.
func TestDevcontainerAsWritten(t *testing.T) {
	cfg := baseConfig(t)
	cfg.Spec = devcontainerRepo(t, fmt.Sprintf(`{
	// as the templates write it
	"image": %q,
	"workspaceFolder": "/workspaces/app",
	"runArgs": ["--privileged", "--cap-add=SYS_PTRACE", "--security-opt", "seccomp=unconfined"],
	"capAdd": ["NET_ADMIN"],
	"mounts": [
		"source=/var/run/docker.sock,target=/var/run/docker.sock,type=bind",
		"source=app-cache,target=/home/cache,type=volume",
	],
	"onCreateCommand": "echo created >> ${containerWorkspaceFolder}/.lifecycle",
	"postCreateCommand": {"a": "echo post-a >> /workspaces/app/.post", "b": "echo post-b >> /workspaces/app/.post"},
	"postStartCommand": ["sh", "-c", "echo started >> /workspaces/app/.lifecycle"],
	"postAttachCommand": "echo attached >> /workspaces/app/.lifecycle",
	"remoteUser": "vscode",
	"customizations": {"vscode": {"extensions": ["golang.go"]}},
}`, cfg.Image))
	s := newSuite(t, cfg)
	ctx := t.Context()
	key := s.key("acme", "devc")

	var mu sync.Mutex
	var dropped *events.DevcontainerDropped
	run, err := s.m.Admit(ctx, sandkeep.RunRequest{Key: key, Observer: sandkeep.Observer{Event: func(name string, payload any) {
		if name == events.NameDevcontainerDropped {
			mu.Lock()
			p := payload.(events.DevcontainerDropped)
			dropped = &p
			mu.Unlock()
		}
	}}})
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	defer run.Finish(nil)
	for _, want := range []string{"--privileged", "--cap-add=SYS_PTRACE", "seccomp=unconfined", "NET_ADMIN", "docker.sock"} {
		if !strings.Contains(run.Dropped, want) {
			t.Errorf("run's dropped line %q does not name %s", run.Dropped, want)
		}
	}
	mu.Lock()
	if dropped == nil || len(dropped.Items) != 5 {
		t.Errorf("sandbox_devcontainer_dropped = %+v, want 5 items", dropped)
	} else {
		for _, it := range dropped.Items {
			if it.Why == "" || it.Line == 0 {
				t.Errorf("dropped item without why or line: %+v", it)
			}
		}
	}
	mu.Unlock()

	exec := func(req sandkeep.ExecRequest) *sandkeep.ExecResult {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		res, err := run.Exec(cctx, req)
		if err != nil {
			t.Fatalf("Exec %q: %v", req.Argv, err)
		}
		if res.ExitCode != 0 {
			t.Fatalf("Exec %q: exit %d, stderr %q", req.Argv, res.ExitCode, res.Stderr)
		}
		return res
	}
	sh := func(script string) string {
		return exec(sandkeep.ExecRequest{Argv: []string{"sh", "-c", script}}).Stdout
	}

	// Hardened whatever the file asked: no capability, no-new-privileges, no Docker socket.
	status := sh("grep -E '^(CapEff|CapPrm|NoNewPrivs):' /proc/self/status; test -e /var/run/docker.sock && echo SOCKET || true")
	wants := []string{"CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "NoNewPrivs:\t1"}
	gvisor := os.Getenv("SANDKEEP_TEST_RUNTIME") == "runsc"
	if gvisor {
		// gVisor's /proc/self/status has no NoNewPrivs line (the flag is set: docs/SECURITY.md, "gVisor"); the
		// engine's security options say it below.
		wants = wants[:2]
	}
	for _, want := range wants {
		if !strings.Contains(status, want) {
			t.Errorf("status lacks %q:\n%s", want, status)
		}
	}
	if strings.Contains(status, "SOCKET") {
		t.Error("the Docker socket is in the sandbox")
	}
	in := s.inspect(key.ContainerName())
	if gvisor && !slices.ContainsFunc(in.HostConfig.SecurityOpt, func(o string) bool { return strings.HasPrefix(o, "no-new-privileges") }) {
		t.Errorf("security options %v lack no-new-privileges", in.HostConfig.SecurityOpt)
	}
	if in.HostConfig.Privileged || len(in.HostConfig.CapAdd) > 0 {
		t.Errorf("container privileged=%v cap-add=%v", in.HostConfig.Privileged, in.HostConfig.CapAdd)
	}

	// The workspace folder: commands start there, the guard takes paths under it, the file API follows it.
	if pwd := strings.TrimSpace(sh("pwd")); pwd != "/workspaces/app" {
		t.Errorf("pwd = %q, want /workspaces/app", pwd)
	}
	if out := exec(sandkeep.ExecRequest{Argv: []string{"pwd"}, Workdir: "/workspaces/app/sub"}).Stdout; strings.TrimSpace(out) != "/workspaces/app/sub" {
		t.Errorf("pwd in /workspaces/app/sub = %q", out)
	}
	if out := exec(sandkeep.ExecRequest{Argv: []string{"pwd"}, Workdir: "sub"}).Stdout; strings.TrimSpace(out) != "/workspaces/app/sub" {
		t.Errorf("relative workdir resolves to %q, want under the workspace folder", out)
	}
	if _, err := run.Exec(ctx, sandkeep.ExecRequest{Argv: []string{"pwd"}, Workdir: "/workspaces/other"}); sandkeep.CodeOf(err) != "INVALID_WORKDIR" {
		t.Errorf("workdir outside the folder: %v, want INVALID_WORKDIR", err)
	}
	fs, err := s.m.Files(key, false, sandkeep.FileLimits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Write(ctx, "/workspaces/app/from-host.txt", strings.NewReader("hello"), 0o644); err != nil {
		t.Fatalf("file API write under the folder: %v", err)
	}
	if got := sh("cat /workspaces/app/from-host.txt"); got != "hello" {
		t.Errorf("the sandbox reads %q", got)
	}
	sh("echo from-sandbox > /workspaces/app/sub/x.txt")
	r, _, err := fs.OpenFile("/workspaces/app/sub/x.txt")
	if err != nil {
		t.Fatalf("file API read under the folder: %v", err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	fs.Close()
	if string(b) != "from-sandbox\n" {
		t.Errorf("file API reads %q", b)
	}

	// Lifecycle: onCreate and postCreate (both parallel halves) once, postStart at each start.
	if got := sh("cat .lifecycle; sort .post"); got != "created\nstarted\nattached\npost-a\npost-b\n" {
		t.Errorf("after create: %q", got)
	}
	sh("echo kept > /home/cache/v")
	if err := s.m.Stop(ctx, key); err != nil {
		t.Fatal(err)
	}
	if got := sh("cat .lifecycle"); got != "created\nstarted\nattached\nstarted\n" {
		t.Errorf("after a stop and a start: %q, want postStartCommand once more, onCreateCommand and postAttachCommand not again", got)
	}
	// A new run is a new session: postAttachCommand runs before its first command.
	run2, err := s.m.Admit(ctx, sandkeep.RunRequest{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	res2, err := run2.Exec(ctx, sandkeep.ExecRequest{Argv: []string{"cat", ".lifecycle"}})
	run2.Finish(err)
	if err != nil || res2.Stdout != "created\nstarted\nattached\nstarted\nattached\n" {
		t.Errorf("second run: %v %q, want postAttachCommand once more", err, res2.Stdout)
	}

	// The named volume survives the sandbox's removal (as recycling and retention remove it) and goes with rm.
	if err := s.m.Remove(ctx, key, true); err != nil {
		t.Fatal(err)
	}
	if got := sh("cat /home/cache/v"); got != "kept\n" {
		t.Errorf("volume after the sandbox was recreated: %q", got)
	}
	volumes := filepath.Join(cfg.Home, "volumes", key.Hex())
	if _, err := os.Stat(volumes); err != nil {
		t.Fatalf("the key's volumes: %v", err)
	}
	if err := s.m.Remove(ctx, key, false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(volumes); !os.IsNotExist(err) {
		t.Errorf("volumes after rm: %v, want gone", err)
	}
}
