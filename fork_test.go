package sandkeep_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/snapshots"
)

// TestFork: a fork on the real driver (Docker: a copy of the host workspace; kubernetes: through both pods'
// agents, from claim to claim). The new key's sandbox runs its source's template and holds the source's files
// (contents, modes, links as links), owned by its own user; the source keeps running; later changes on either
// side stay apart. A target that exists, a source without a sandbox, a template other than the
// source's and a copy past the limits are refused with their codes and leave nothing of the new key.
func TestFork(t *testing.T) {
	cfg := baseConfig(t)
	cfg.Templates = map[string]sandkeep.Template{"py": {Env: []string{"FLAVOUR=py"}}, "other": {}}
	s := newSuite(t, cfg)
	sh := func(key sandkeep.Key, script string) string { // in template py: a run of another would recycle the sandbox
		t.Helper()
		res := s.execRun(s.m, sandkeep.RunRequest{Key: key, Template: "py"}, sandkeep.ExecRequest{Argv: []string{"sh", "-c", script}})
		if res.ExitCode != 0 {
			t.Fatalf("sh -c %q: exit %d, %q %q", script, res.ExitCode, res.Stdout, res.Stderr)
		}
		return res.Stdout
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	a, b := s.key("fork", "a"), s.key("fork", "b")
	sh(a, "mkdir -p src/deep && echo one > src/deep/f && printf '#!/bin/sh\\necho run\\n' > tool && chmod 750 tool && "+
		"ln -s src/deep/f link && head -c 200000 /dev/urandom > blob")
	before := sh(a, "find . | sort; md5sum blob src/deep/f; stat -c '%n %a' tool; readlink link")

	var mu sync.Mutex
	var forked []events.SandboxForked
	rr := sandkeep.RunRequest{Key: b, Observer: sandkeep.Observer{Event: func(name string, p any) {
		if ev, ok := p.(events.SandboxForked); ok {
			mu.Lock()
			forked = append(forked, ev)
			mu.Unlock()
		}
	}}}
	sb, err := snapshots.Fork(ctx, s.m, a, rr, snapshots.ForkLimits{})
	if err != nil {
		t.Fatalf("Fork: %v", err)
	}
	if sb.User != b.User || sb.Template != "py" || sb.State != "running" || sb.Name != b.ContainerName() {
		t.Fatalf("the fork's sandbox: %+v", sb)
	}
	if len(forked) != 1 || forked[0].From != a.ContainerName() || forked[0].Files != 3 || forked[0].Bytes < 200000 {
		t.Fatalf("sandbox_forked: %+v", forked)
	}
	if src, err := s.m.Sandbox(ctx, a); err != nil || src.State != "running" {
		t.Fatalf("the source after the fork: %+v, %v", src, err)
	}
	if got := sh(b, "find . | sort; md5sum blob src/deep/f; stat -c '%n %a' tool; readlink link"); got != before {
		t.Fatalf("the copy differs:\n%s\nsource:\n%s", got, before)
	}
	if got := trim(sh(b, "echo $FLAVOUR; ./tool; [ \"$(stat -c %u blob)\" = \"$(id -u)\" ] && echo owned")); got != "py\nrun\nowned" {
		t.Fatalf("the copy's template, tool and owner: %q", got)
	}

	sh(b, "echo changed > src/deep/f; rm blob")
	sh(a, "echo fresh > fresh")
	if got := sh(a, "cat src/deep/f; ls"); got != "one\nblob\nfresh\nlink\nsrc\ntool\n" {
		t.Fatalf("the source after changes in the copy: %q", got)
	}
	if got := sh(b, "cat src/deep/f; ls"); got != "changed\nlink\nsrc\ntool\n" {
		t.Fatalf("the copy after changes in the source: %q", got)
	}

	c := s.key("fork", "c")
	refused := func(what string, err error, code sandkeep.Code) {
		t.Helper()
		if sandkeep.CodeOf(err) != code {
			t.Fatalf("%s: %v, want %s", what, err, code)
		}
		if _, err := s.m.Sandbox(ctx, c); sandkeep.CodeOf(err) != "SANDBOX_NOT_FOUND" {
			t.Fatalf("%s left a sandbox: %v", what, err)
		}
		if _, err := s.m.FilesContext(ctx, c, false, sandkeep.FileLimits{}); sandkeep.CodeOf(err) != "FILE_NOT_FOUND" {
			t.Fatalf("%s left a workspace: %v", what, err)
		}
	}
	_, err = snapshots.Fork(ctx, s.m, a, sandkeep.RunRequest{Key: b}, snapshots.ForkLimits{})
	if sandkeep.CodeOf(err) != "SANDBOX_EXISTS" {
		t.Fatalf("fork onto an existing key: %v, want SANDBOX_EXISTS", err)
	}
	_, err = snapshots.Fork(ctx, s.m, s.key("fork", "nobody"), sandkeep.RunRequest{Key: c}, snapshots.ForkLimits{})
	refused("a fork of a key without a sandbox", err, "SANDBOX_NOT_FOUND")
	_, err = snapshots.Fork(ctx, s.m, a, sandkeep.RunRequest{Key: c, Template: "other"}, snapshots.ForkLimits{})
	refused("a fork into another template", err, "INVALID_ARGUMENT")
	_, err = snapshots.Fork(ctx, s.m, a, sandkeep.RunRequest{Key: c}, snapshots.ForkLimits{Bytes: 100000})
	refused("a fork past its byte limit", err, "QUOTA_EXCEEDED")
	_, err = snapshots.Fork(ctx, s.m, a, sandkeep.RunRequest{Key: c}, snapshots.ForkLimits{Inodes: 4})
	refused("a fork past its file limit", err, "QUOTA_EXCEEDED")
}
