package sandkeep

import (
	"context"
	"time"
)

// Stats is one sample of a running sandbox's resource use, as its engine counts it.
type Stats struct {
	At      time.Time     // when the sample was taken
	Since   time.Time     // when the sandbox started: CPUTime counts from then
	CPUTime time.Duration // CPU time used since Since, over all its CPUs
	CPUs    float64       // the CPUs it may use: its limit, else the host's
	// MemoryUsed excludes the reclaimable page cache, MemoryCache; MemoryLimit is its limit, else the host's.
	MemoryUsed, MemoryLimit, MemoryCache int64
	// DiskUsed and DiskTotal: the file system its workspace lives on (its quota's, else the host's); zero where
	// the driver keeps the workspace itself.
	DiskUsed, DiskTotal int64
}

// Stats samples key's running sandbox. None is SANDBOX_NOT_FOUND, a stopped one SANDBOX_NOT_RUNNING; a driver
// that reads no stats (only Docker's does) is SPEC_UNSUPPORTED.
func (m *Manager) Stats(ctx context.Context, key Key) (Stats, error) {
	s, err := m.e.Stats(ctx, key)
	return Stats{At: s.At, Since: s.Since, CPUTime: s.CPUTime, CPUs: s.CPUs, MemoryUsed: s.MemoryUsed,
		MemoryLimit: s.MemoryLimit, MemoryCache: s.MemoryCache, DiskUsed: s.DiskUsed, DiskTotal: s.DiskTotal}, err
}
