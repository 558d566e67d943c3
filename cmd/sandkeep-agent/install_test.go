//go:build linux

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestInstallSelf: `install DIR` copies this very binary to DIR/sandkeep-agent, read-only and executable.
func TestInstallSelf(t *testing.T) {
	dir := t.TempDir()
	if code, ok := installBuiltin([]string{"install", dir}); !ok || code != 0 {
		t.Fatalf("install: code %d handled %v", code, ok)
	}
	got, err := os.ReadFile(filepath.Join(dir, "sandkeep-agent"))
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, self) {
		t.Errorf("installed %d bytes, not this binary (%d bytes)", len(got), len(self))
	}
	if st, _ := os.Stat(filepath.Join(dir, "sandkeep-agent")); st.Mode().Perm() != 0o555 {
		t.Errorf("mode %v, want 0555", st.Mode())
	}
	if code, ok := installBuiltin([]string{"install", "relative"}); !ok || code == 0 {
		t.Errorf("install of a relative dir: code %d", code)
	}
	if _, ok := installBuiltin([]string{"serve"}); ok {
		t.Error("installBuiltin took serve")
	}
}
