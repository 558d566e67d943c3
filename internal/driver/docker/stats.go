package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/driver"
)

var _ driver.StatsReporter = (*Driver)(nil)

// Stats reads one sample of sb's container stats (one-shot: the engine answers at once, without the second
// sample it would wait about a second for) and its CPU limit from an inspect.
func (d *Driver) Stats(ctx context.Context, sb *driver.Sandbox) (driver.Stats, error) {
	ins, err := d.api.ContainerInspect(ctx, sb.ID, client.ContainerInspectOptions{})
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return driver.Stats{}, fmt.Errorf("stats of %s: %w", sb.Name, cerrdefs.ErrNotFound)
		}
		return driver.Stats{}, fmt.Errorf("stats of %s: %w", sb.Name, err)
	}
	if ins.Container.State == nil || !ins.Container.State.Running {
		return driver.Stats{}, fmt.Errorf("stats of %s: %w: it is not running", sb.Name, cerrdefs.ErrConflict)
	}
	res, err := d.api.ContainerStats(ctx, sb.ID, client.ContainerStatsOptions{})
	if err != nil {
		return driver.Stats{}, fmt.Errorf("stats of %s: %w", sb.Name, err)
	}
	defer res.Body.Close()
	var st container.StatsResponse
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil {
		return driver.Stats{}, fmt.Errorf("stats of %s: %w", sb.Name, err)
	}
	var nano int64
	if ins.Container.HostConfig != nil {
		nano = ins.Container.HostConfig.NanoCPUs
	}
	return statsOf(st, nano), nil
}

// statsOf reads a stats response the way `docker stats` does: memory used is the usage less the inactive page
// cache (cgroup v2's inactive_file, v1's total_inactive_file), which the kernel reclaims first.
func statsOf(st container.StatsResponse, nanoCPUs int64) driver.Stats {
	out := driver.Stats{At: st.Read, CPUTime: time.Duration(st.CPUStats.CPUUsage.TotalUsage),
		CPUs: float64(st.CPUStats.OnlineCPUs), MemoryLimit: int64(st.MemoryStats.Limit)}
	if out.At.IsZero() {
		out.At = time.Now()
	}
	if nanoCPUs > 0 {
		out.CPUs = float64(nanoCPUs) / 1e9
	}
	cache, ok := st.MemoryStats.Stats["inactive_file"]
	if !ok {
		cache = st.MemoryStats.Stats["total_inactive_file"]
	}
	used := st.MemoryStats.Usage
	if cache < used {
		used -= cache
	}
	out.MemoryUsed, out.MemoryCache = int64(used), int64(cache)
	return out
}
