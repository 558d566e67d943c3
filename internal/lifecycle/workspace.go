package lifecycle

import (
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Workspace returns key's workspace directory and the sandbox user that owns it, for host-side file access.
// With create, a missing workspace is created as a first command would create it; without, it is
// FILE_NOT_FOUND (nothing was ever written for this user).
func (m *Manager) Workspace(key identity.Key, create bool) (dir string, uid, gid int, err error) {
	if !create && !m.home.HasWorkspace(key) {
		return "", 0, 0, fault.New(fault.FileNotFound, "run a command or upload a file first",
			"no workspace for %s", key)
	}
	if uid, gid, err = m.idOf(key); err != nil {
		return "", 0, 0, err
	}
	// Its sandbox may be running: the quota file system is mounted if it is not, never grown.
	dir, err = m.ensureWorkspace(key, false)
	if err != nil {
		return "", 0, 0, err
	}
	return dir, uid, gid, nil
}
