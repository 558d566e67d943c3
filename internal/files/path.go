package files

import (
	"fmt"
	"strings"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// Bounds of a path, Linux's PATH_MAX and NAME_MAX.
const (
	MaxPathLen = 4096
	MaxNameLen = 255
)

// workspaceDir is where the workspace is mounted in the sandbox; paths are written as the sandbox sees them.
const workspaceDir = "/workspace"

const pathHint = "use a path relative to /workspace (e.g. src/main.go) or an absolute one under /workspace, without '..'"

// CleanPath returns path relative to the workspace, clean and slash-separated, or "." for the workspace
// itself. It accepts what a command in the sandbox would write: a relative path, or an absolute one under
// /workspace. Any ".." component is refused (even one that would stay inside: a ".." after a link means
// something else than it reads), as are absolute paths elsewhere, NUL bytes, and paths or components over
// MaxPathLen and MaxNameLen bytes; the refusal is INVALID_PATH with a hint.
func CleanPath(path string) (string, error) {
	comps, err := parsePath(path)
	if err != nil {
		return "", err
	}
	return joinComps(comps), nil
}

// parsePath is CleanPath returning the components; none is the workspace itself.
func parsePath(path string) ([]string, error) {
	if len(path) > MaxPathLen {
		return nil, fault.New(fault.InvalidPath, pathHint, "the path is %d bytes long, over the limit of %d", len(path), MaxPathLen)
	}
	rel := path
	if strings.HasPrefix(path, "/") {
		switch {
		case path == workspaceDir:
			rel = ""
		case strings.HasPrefix(path, workspaceDir+"/"):
			rel = path[len(workspaceDir)+1:]
		default:
			return nil, fault.New(fault.InvalidPath, pathHint, "the path %q is outside %s", path, workspaceDir)
		}
	}
	comps, why := splitRel(rel)
	if why != "" {
		return nil, fault.New(fault.InvalidPath, pathHint, "the path %q %s", path, why)
	}
	return comps, nil
}

// parseEntryName parses a tar entry's name, which is relative to the directory being extracted into: an
// absolute name is refused rather than re-rooted, so that what the archive says and what lands can be compared.
func parseEntryName(name string) ([]string, error) {
	if len(name) > MaxPathLen {
		return nil, fault.New(fault.InvalidPath, tarPathHint, "a tar entry name is %d bytes long, over the limit of %d", len(name), MaxPathLen)
	}
	if strings.HasPrefix(name, "/") {
		return nil, fault.New(fault.InvalidPath, tarPathHint, "the tar entry %q has an absolute name", name)
	}
	comps, why := splitRel(name)
	if why != "" {
		return nil, fault.New(fault.InvalidPath, tarPathHint, "the tar entry %q %s", name, why)
	}
	return comps, nil
}

const tarPathHint = "create the archive from inside the directory (tar -C dir -cf - .) so entry names are relative and have no '..'"

// splitRel splits rel into its components, dropping empty and "." ones. A refusal is why, a phrase that
// follows the path in a message.
func splitRel(rel string) (comps []string, why string) {
	if strings.IndexByte(rel, 0) >= 0 {
		return nil, "has a NUL byte"
	}
	for c := range strings.SplitSeq(rel, "/") {
		switch {
		case c == "" || c == ".":
			continue
		case c == "..":
			return nil, "has a '..' component"
		case len(c) > MaxNameLen:
			return nil, fmt.Sprintf("has a component of %d bytes, over the limit of %d", len(c), MaxNameLen)
		}
		comps = append(comps, c)
	}
	return comps, ""
}

// joinComps is the relative path of comps, "." for none.
func joinComps(comps []string) string {
	if len(comps) == 0 {
		return "."
	}
	return strings.Join(comps, "/")
}

// display is comps as the sandbox sees it, for messages.
func display(comps []string) string {
	if len(comps) == 0 {
		return workspaceDir
	}
	return workspaceDir + "/" + strings.Join(comps, "/")
}
