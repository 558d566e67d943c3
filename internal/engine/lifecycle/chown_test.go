package lifecycle

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestChownTreeSymlinkSwap: a directory of the workspace swapped for a symlink to elsewhere while chownTree walks
// (a command still running could do it between a directory's listing and its reading) is not followed: nothing
// outside the workspace changes owner (issue 22, Low 10). Changing owners needs root, as EnsureWorkspace's
// hand-over does.
func TestChownTreeSymlinkSwap(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing owners needs root (EnsureWorkspace hands a workspace over only as root)")
	}
	const old, uid = 4242, 5353
	ws, outside := t.TempDir(), t.TempDir()
	for _, d := range []string{filepath.Join(ws, "a"), filepath.Join(ws, "b")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := []string{filepath.Join(ws, "a", "f"), filepath.Join(ws, "b", "g"), filepath.Join(outside, "secret")}
	for _, f := range files {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range append(files, filepath.Join(ws, "a"), filepath.Join(ws, "b"), outside) {
		if err := os.Lchown(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	chownVisited = func(p string) {
		if filepath.Base(p) != "b" {
			return
		}
		// b was listed as a directory and handed over; before it is read, it becomes a link out.
		if err := os.Rename(filepath.Join(ws, "b"), filepath.Join(ws, "b.moved")); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(outside, filepath.Join(ws, "b")); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { chownVisited = nil })
	err := chownTree(ws, old, uid, uid)
	t.Logf("chownTree after the swap: %v", err)
	owner := func(p string) int {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		return int(st.Uid)
	}
	if got := owner(filepath.Join(outside, "secret")); got != old {
		t.Errorf("a file outside the workspace, reached through the swapped link, changed owner to %d", got)
	}
	if got := owner(outside); got != old {
		t.Errorf("the link's target changed owner to %d", got)
	}
	if got := owner(filepath.Join(ws, "a", "f")); got != uid {
		t.Errorf("a file of the workspace walked before the swap has owner %d, want %d", got, uid)
	}
}
