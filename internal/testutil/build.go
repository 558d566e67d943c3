package testutil

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// AgentBinary returns the path of a static sandkeep-agent (./cmd/sandkeep-agent, CGO_ENABLED=0) built from this
// module's source once per test process. The test fails with the build output when it does not build.
func AgentBinary(t testing.TB) string {
	t.Helper()
	return BuildBinary(t, "./cmd/sandkeep-agent", "sandkeep-agent", false)
}

type buildResult struct {
	once sync.Once
	path string
	err  error
}

var builds sync.Map // buildKey -> *buildResult

type buildKey struct {
	pkg, name string
	cgo       bool
}

// BuildBinary builds pkg (a package path relative to the module root, like "./cmd/sandkeep") with -trimpath
// into an executable called name, with cgo on or off, once per test process, and returns its path. The test
// fails with the build output when it does not build.
//
// Binaries live under os.TempDir()/sandkeep-testbin/<hash of module root, pkg, cgo>/ and are replaced atomically,
// so parallel test processes can build the same binary at once and nothing piles up between runs.
func BuildBinary(t testing.TB, pkg, name string, cgo bool) string {
	t.Helper()
	v, _ := builds.LoadOrStore(buildKey{pkg, name, cgo}, &buildResult{})
	r := v.(*buildResult)
	r.once.Do(func() { r.path, r.err = buildBinary(pkg, name, cgo) })
	if r.err != nil {
		t.Fatalf("build %s: %v", pkg, r.err)
	}
	return r.path
}

func buildBinary(pkg, name string, cgo bool) (string, error) {
	if name == "" || strings.ContainsAny(name, `/\`) {
		return "", fmt.Errorf("bad binary name %q", name)
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(root + "\x00" + pkg + "\x00" + strconv.FormatBool(cgo)))
	dir := filepath.Join(os.TempDir(), "sandkeep-testbin", hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	final := filepath.Join(dir, name)
	tmp := fmt.Sprintf("%s.tmp-%d", final, os.Getpid())
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp, pkg)
	cmd.Dir = root
	cgoEnv := "CGO_ENABLED=0"
	if cgo {
		cgoEnv = "CGO_ENABLED=1"
	}
	cmd.Env = append(os.Environ(), cgoEnv)
	out, err := cmd.CombinedOutput()
	if err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("%s %s: %w\n%s", cgoEnv, strings.Join(cmd.Args, " "), err, out)
	}
	if err := os.Rename(tmp, final); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return final, nil
}

var moduleRoot struct {
	once sync.Once
	dir  string
	err  error
}

// ModuleRoot returns the directory holding this module's go.mod.
func ModuleRoot() (string, error) {
	moduleRoot.once.Do(func() {
		moduleRoot.dir, moduleRoot.err = findModuleRoot()
	})
	return moduleRoot.dir, moduleRoot.err
}

func findModuleRoot() (string, error) {
	// The source location of this file works unless the test binary was built with -trimpath.
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		dir := filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
	}
	// go test runs in the package's directory, inside the module.
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("find module root: go env GOMOD: %w", err)
	}
	gomod := string(bytes.TrimSpace(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("find module root: not inside a Go module")
	}
	return filepath.Dir(gomod), nil
}
