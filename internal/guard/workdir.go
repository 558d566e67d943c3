package guard

import (
	"path"
	"strings"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// MaxWorkdirLen is the longest workdir accepted, in bytes, before and after resolution (Linux's PATH_MAX).
const MaxWorkdirLen = 4096

// workdirHint is the one fix for every workdir refusal.
const workdirHint = "use a path relative to /workspace, e.g. src/app"

// Workdir resolves the directory a command runs in: "" is /workspace, a relative path lies under /workspace,
// and an absolute path must be /workspace or beneath it. It returns the clean absolute path. Any ".."
// component is refused, even one that would stay inside, so that what the caller wrote and what runs can be
// compared by eye; so is a "proc" component, which is how /proc/self/cwd-style escapes are spelled.
func Workdir(dir string) (string, error) {
	if dir == "" {
		return driver.WorkspaceDir, nil
	}
	if err := checkWorkdirText(dir); err != nil {
		return "", err
	}
	abs := path.Clean(dir)
	if !path.IsAbs(dir) {
		abs = path.Join(driver.WorkspaceDir, dir)
	}
	if abs != driver.WorkspaceDir && !strings.HasPrefix(abs, driver.WorkspaceDir+"/") {
		return "", fault.New(fault.InvalidWorkdir, workdirHint, "workdir %q is outside %s", dir, driver.WorkspaceDir)
	}
	if len(abs) > MaxWorkdirLen {
		return "", fault.New(fault.InvalidWorkdir, workdirHint, "workdir resolves to %d bytes, over the limit of %d", len(abs), MaxWorkdirLen)
	}
	return abs, nil
}

// checkWorkdirText applies the rules that look at dir as written.
func checkWorkdirText(dir string) error {
	if len(dir) > MaxWorkdirLen {
		return fault.New(fault.InvalidWorkdir, workdirHint, "workdir is %d bytes long, over the limit of %d", len(dir), MaxWorkdirLen)
	}
	if why := badChar(dir); why != "" {
		return fault.New(fault.InvalidWorkdir, workdirHint, "workdir %q %s", dir, why)
	}
	if strings.HasPrefix(dir, "-") {
		return fault.New(fault.InvalidWorkdir, workdirHint, "workdir %q starts with '-'", dir)
	}
	for _, n := range strings.Split(dir, "/") {
		switch n {
		case "..":
			return fault.New(fault.InvalidWorkdir, workdirHint, "workdir %q has a '..' component", dir)
		case "proc":
			return fault.New(fault.InvalidWorkdir, workdirHint, "workdir %q has a 'proc' component", dir)
		}
	}
	return nil
}
