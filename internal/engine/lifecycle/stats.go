package lifecycle

import (
	"context"
	"os"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Stats is one sample of a running sandbox's resource use: the engine's count of its CPU and memory, when it
// started (CPUTime counts from then), and the disk its workspace lives on.
type Stats struct {
	driver.Stats
	Since time.Time
	// DiskUsed and DiskTotal: the workspace's own file system under a quota, else the host file system that holds
	// it (what `df /workspace` shows inside the sandbox); where the driver keeps it (a kubernetes claim), what
	// the driver measured of it (driver.Stats), else zero.
	DiskUsed, DiskTotal int64
}

// Stats samples key's sandbox. No sandbox is SANDBOX_NOT_FOUND, a stopped one SANDBOX_NOT_RUNNING, and a driver
// that reads no stats SPEC_UNSUPPORTED. It takes no gate: a sample is read beside running commands.
func (m *Manager) Stats(ctx context.Context, key identity.Key) (Stats, error) {
	sr, ok := m.drv.(driver.StatsReporter)
	if !ok {
		return Stats{}, fault.New(fault.SpecUnsupported, "resource stats are read on the docker and kubernetes drivers",
			"the %s driver reports no resource stats", m.drv.Name())
	}
	sb, err := m.owned(ctx, key)
	if fault.Is(err, fault.ForeignContainer) {
		err = errNoSandbox(key)
	}
	if err != nil {
		return Stats{}, err
	}
	notRunning := fault.New(fault.SandboxNotRunning, "run a command in it to start it", "the sandbox of %s is not running", key)
	if sb.State != driver.StateRunning {
		return Stats{}, notRunning
	}
	ds, err := sr.Stats(ctx, sb)
	if cerrdefs.IsConflict(err) || cerrdefs.IsNotFound(err) {
		return Stats{}, notRunning
	}
	if cerrdefs.IsPermissionDenied(err) { // the kubernetes driver's credentials may not read the kubelet's stats
		return Stats{}, fault.Wrap(err, fault.SpecUnsupported, "grant get on nodes/proxy to read them (docs/KUBERNETES.md, \"Resource stats\")",
			"the %s driver may not read resource stats here: %v", m.drv.Name(), err)
	}
	if err != nil {
		return Stats{}, fault.Wrap(err, fault.DriverUnavailable, "check the engine: `sandkeep doctor`", "reading the stats of %s", key)
	}
	st := Stats{Stats: ds, Since: sb.StartedAt, DiskUsed: ds.DiskUsed, DiskTotal: ds.DiskTotal}
	if ds.DiskTotal > 0 { // the driver keeps and measured the workspace (a kubernetes claim)
		return st, nil
	}
	if u, ok := m.home.WorkspaceUsage(key); ok {
		st.DiskUsed, st.DiskTotal = u.Bytes, u.BytesLimit
	} else if dir := m.home.Workspace(key); dirExists(dir) {
		var fs unix.Statfs_t
		if unix.Statfs(dir, &fs) == nil {
			bs := int64(fs.Bsize)
			st.DiskUsed, st.DiskTotal = (int64(fs.Blocks)-int64(fs.Bfree))*bs, int64(fs.Blocks)*bs
		}
	}
	return st, nil
}

func dirExists(dir string) bool {
	fi, err := os.Stat(dir)
	return err == nil && fi.IsDir()
}
