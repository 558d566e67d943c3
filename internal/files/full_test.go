package files

import (
	"bytes"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestWriteWorkspaceFull: a full disk under the workspace is WORKSPACE_FULL, something a person can act on,
// and the partial file is gone. The workspace is a 64 KiB tmpfs (mounting one needs root).
func TestWriteWorkspaceFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700"); err != nil {
		t.Fatalf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	f, err := Open(dir, -1, -1, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = f.Write(t.Context(), "big.bin", bytes.NewReader(make([]byte, 1<<20)), 0)
	if fault.CodeOf(err) != fault.WorkspaceFull {
		t.Fatalf("writing 1 MiB into 64 KiB: %v, want WORKSPACE_FULL", err)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 0 {
		t.Errorf("a failed write left %v", left)
	}
}
