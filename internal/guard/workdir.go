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
func Workdir(dir string) (string, error) { return WorkdirIn("", dir) }

// WorkdirIn is Workdir for a sandbox whose workspace is also mounted at folder (a devcontainer.json's
// workspaceFolder; "" or /workspace is the default): "" is folder, a relative path lies under folder, and an
// absolute path must be under folder or under /workspace (the same directory).
func WorkdirIn(folder, dir string) (string, error) {
	if folder == "" {
		folder = driver.WorkspaceDir
	}
	if dir == "" {
		return folder, nil
	}
	if err := checkWorkdirText(dir); err != nil {
		return "", err
	}
	abs := path.Clean(dir)
	if !path.IsAbs(dir) {
		abs = path.Join(folder, dir)
	}
	if !under(abs, driver.WorkspaceDir) && !under(abs, folder) {
		return "", fault.New(fault.InvalidWorkdir, workdirHint, "workdir %q is outside %s", dir, folder)
	}
	if len(abs) > MaxWorkdirLen {
		return "", fault.New(fault.InvalidWorkdir, workdirHint, "workdir resolves to %d bytes, over the limit of %d", len(abs), MaxWorkdirLen)
	}
	return abs, nil
}

func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// WorkdirText checks a workdir as written, before the sandbox's workspace folder is known (at the edges): the
// text rules of Workdir, and for a relative path Workdir itself. Where an absolute path lies is checked by
// WorkdirIn when the command is sent.
func WorkdirText(dir string) error {
	if dir == "" {
		return nil
	}
	if err := checkWorkdirText(dir); err != nil {
		return err
	}
	if !path.IsAbs(dir) {
		_, err := Workdir(dir)
		return err
	}
	if len(dir) > MaxWorkdirLen {
		return fault.New(fault.InvalidWorkdir, workdirHint, "workdir is %d bytes long, over the limit of %d", len(dir), MaxWorkdirLen)
	}
	return nil
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
