//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// installBuiltin handles `sandkeep-agent install DIR`: the kubernetes driver's init container runs it from the
// agent image (FROM scratch: no cp) to copy this very binary into the pod's agent volume, read-only and
// executable, before the sandbox container starts from an image sandkeep does not trust.
func installBuiltin(args []string) (code int, ok bool) {
	if len(args) == 0 || args[0] != "install" {
		return 0, false
	}
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: sandkeep-agent install DIR")
		return 2, true
	}
	if err := installSelf(args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "sandkeep-agent install: %v\n", err)
		return 1, true
	}
	return 0, true
}

func installSelf(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("%q is not an absolute directory", dir)
	}
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer src.Close()
	tmp, err := os.CreateTemp(dir, ".sandkeep-agent-*")
	if err != nil {
		return err
	}
	_, cerr := io.Copy(tmp, src)
	if err := errors.Join(cerr, tmp.Chmod(0o555), tmp.Close()); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, "sandkeep-agent")); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}
