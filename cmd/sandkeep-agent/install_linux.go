//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// installBuiltin handles `sandkeep-agent install DIR`: the kubernetes driver's init container runs it from the
// agent image (FROM scratch: no cp) to copy this very binary into the pod's agent volume, read-only and
// executable, before the sandbox container starts from an image sandkeep does not trust.
func installBuiltin(args []string) (code int, ok bool) {
	if len(args) == 0 || args[0] != "install" {
		return 0, false
	}
	tokenFile := ""
	if len(args) == 4 && args[2] == "--token-file" && filepath.IsAbs(args[3]) {
		tokenFile = args[3]
	} else if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: sandkeep-agent install DIR [--token-file PATH]")
		return 2, true
	}
	if err := installSelf(args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "sandkeep-agent install: %v\n", err)
		return 1, true
	}
	if tokenFile != "" {
		if err := writeToken(tokenFile); err != nil {
			fmt.Fprintf(os.Stderr, "sandkeep-agent install: channel token: %v\n", err)
			return 1, true
		}
	}
	return 0, true
}

// writeToken writes $SANDKEEP_CHANNEL_TOKEN to path, mode 0400, for the sandbox's init to read once and remove
// (net_linux.go). The variable is the init container's only: the sandbox container never has it.
func writeToken(path string) error {
	token := os.Getenv(tokenEnv)
	if len(token) < agentproto.MinHelloToken || len(token) > agentproto.MaxHelloToken {
		return fmt.Errorf("$%s holds %d bytes, not a token", tokenEnv, len(token))
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o400)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(token)
	if err := errors.Join(werr, f.Close()); err != nil {
		os.Remove(path)
		return err
	}
	return nil
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
