package lifecycle

import (
	"context"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Workspace returns key's workspace directory and the sandbox user that owns it, for host-side file access.
// With create, a missing workspace is created as a first command would create it; without, it is
// FILE_NOT_FOUND (nothing was ever written for this user).
func (m *Manager) Workspace(key identity.Key, create bool) (dir string, uid, gid int, err error) {
	if _, elsewhere := m.drv.(driver.WorkspaceRemover); elsewhere {
		// The driver keeps the workspace itself (a Kubernetes claim): the host directory is not what the sandbox
		// sees, and a write there would look done and never reach it. The file API goes through the agent
		// (RemoteWorkspace) instead.
		return "", 0, 0, fault.New(fault.FilesUnavailable, "use the file API (Manager.Files), which reaches it through the sandbox's agent",
			"the %s driver keeps the workspace of %s in the cluster, not in a host directory", m.drv.Name(), key)
	}
	if !create && !m.home.HasWorkspace(key) {
		return "", 0, 0, fault.New(fault.FileNotFound, "run a command or upload a file first",
			"no workspace for %s", key)
	}
	if uid, gid, err = m.idOf(key, m.def); err != nil {
		return "", 0, 0, err
	}
	// Its sandbox may be running: the quota file system is mounted if it is not, never grown.
	// No run asks here (file access): what it finds of the owner goes to the Manager's events.
	dir, err = m.ensureWorkspace(context.Background(), key, m.def, false)
	if err != nil {
		return "", 0, 0, err
	}
	return dir, uid, gid, nil
}

// HomeWorkspace is Workspace without a driver: key's workspace in home, owned by its sandbox's user as the
// Docker driver's Manager would make it (the key's uid of the range recorded in home, or cfg's User). The file
// API uses it so that files can be read and written while no engine answers. It refuses a cfg with a workspace
// quota, whose file system only a Manager mounts.
func HomeWorkspace(home *Home, cfg Config, key identity.Key, create bool) (dir string, uid, gid int, err error) {
	if cfg.DiskBytes > 0 {
		return "", 0, 0, fault.New(fault.SandboxDriverUnavailable, "start the container engine (docker info), then try again",
			"the workspace of %s has a quota of its own, which needs a usable driver", key)
	}
	if !create && !home.HasWorkspace(key) {
		return "", 0, 0, fault.New(fault.FileNotFound, "run a command or upload a file first", "no workspace for %s", key)
	}
	r := cfg.effectiveUIDs("docker")
	cfg.setDefaults()
	if r.Count > 0 {
		if uid, err = home.AllocateUID(key, r, HostIDTaken); err != nil {
			return "", 0, 0, err
		}
		gid = uid
	} else if uid, gid, err = parseUser(cfg.User); err != nil {
		return "", 0, 0, err
	}
	dir, err = home.EnsureWorkspace(key, uid, gid)
	return dir, uid, gid, err
}
