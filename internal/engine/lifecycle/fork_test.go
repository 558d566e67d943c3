package lifecycle

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// tree reads the workspace at dir: each path's content, or "-> target" for a link, or "dir".
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			out[rel] = "-> " + target
			return err
		case d.IsDir():
			out[rel] = "dir"
		default:
			b, err := os.ReadFile(p)
			out[rel] = string(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFork: the new key's files equal the source's (links copied as links, never followed), the source keeps
// running, later changes stay apart; a target that exists, a source that does not and a copy past the quota are
// refused with their codes and leave nothing.
func TestFork(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	a, b := key(t, "acme", "a"), key(t, "acme", "b")
	run(t, m, a, `mkdir -p src/deep && echo one > src/deep/f && head -c 100000 /dev/zero > big && ln -s /etc/passwd link && echo top > top`)
	var forked *events.SandboxForked
	sb, err := m.Fork(t.Context(), a, b, nil, ForkOptions{OnEvent: func(name string, p any) {
		if ev, ok := p.(events.SandboxForked); ok && name == events.NameSandboxForked {
			forked = &ev
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if forked == nil || forked.Sandbox != b.ContainerName() || forked.From != a.ContainerName() || forked.Files != 3 ||
		forked.Bytes != 100000+4+4 {
		t.Fatalf("sandbox_forked: %+v", forked)
	}
	if sb.Name != b.ContainerName() || sb.State != driver.StateRunning {
		t.Fatalf("fork's sandbox %s is %s", sb.Name, sb.State)
	}
	if e.inspect(a).State != driver.StateRunning {
		t.Fatal("the source stopped")
	}
	wa, wb := m.home.Workspace(a), m.home.Workspace(b)
	ta, tb := tree(t, wa), tree(t, wb)
	if len(ta) != len(tb) || tb["link"] != "-> /etc/passwd" {
		t.Fatalf("copy differs: %v vs %v", keys(ta), keys(tb))
	}
	for p, v := range ta {
		if tb[p] != v {
			t.Fatalf("%s: %q in the copy, %q in the source", p, short(tb[p]), short(v))
		}
	}
	run(t, m, b, `echo changed > top; rm src/deep/f`)
	run(t, m, a, `echo new > fresh`)
	if got := tree(t, wa); got["top"] != "top\n" || got["src/deep/f"] != "one\n" {
		t.Fatalf("a change in the copy reached the source: %v", got)
	}
	if _, ok := tree(t, wb)["fresh"]; ok {
		t.Fatal("a change in the source reached the copy")
	}

	c := key(t, "acme", "c")
	_, err = m.Fork(t.Context(), a, b, nil, ForkOptions{})
	if !fault.Is(err, fault.SandboxExists) {
		t.Fatalf("fork onto an existing key: %v, want SANDBOX_EXISTS", err)
	}
	_, err = m.Fork(t.Context(), key(t, "acme", "nobody"), c, nil, ForkOptions{})
	if !fault.Is(err, fault.NotFound) {
		t.Fatalf("fork of an unknown key: %v, want SANDBOX_NOT_FOUND", err)
	}
	for _, lim := range []ForkLimits{{Bytes: 50000}, {Inodes: 3}} {
		_, err = m.Fork(t.Context(), a, c, nil, ForkOptions{Limits: lim})
		if !fault.Is(err, fault.QuotaExceeded) {
			t.Fatalf("fork past %+v: %v, want QUOTA_EXCEEDED", lim, err)
		}
		if m.home.HasWorkspace(c) || exists(m.home.Workspace(c)) {
			t.Fatal("a refused fork left a workspace")
		}
		e.absent(c)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func short(s string) string {
	if len(s) > 20 {
		return s[:20] + "..."
	}
	return s
}
