package docker

import (
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
)

// TestStatsOf: memory used is the usage less the inactive page cache (cgroup v2's inactive_file, v1's
// total_inactive_file), as `docker stats` shows it; the CPUs are the container's limit, else the online CPUs.
func TestStatsOf(t *testing.T) {
	at := time.Unix(1_800_000_000, 0)
	resp := func(stats map[string]uint64) container.StatsResponse {
		return container.StatsResponse{Read: at,
			CPUStats:    container.CPUStats{CPUUsage: container.CPUUsage{TotalUsage: uint64(3 * time.Second)}, OnlineCPUs: 4},
			MemoryStats: container.MemoryStats{Usage: 100 << 20, Limit: 512 << 20, Stats: stats}}
	}
	v2 := statsOf(resp(map[string]uint64{"inactive_file": 30 << 20}), 1_500_000_000)
	if v2.At != at || v2.CPUTime != 3*time.Second || v2.CPUs != 1.5 || v2.MemoryUsed != 70<<20 ||
		v2.MemoryCache != 30<<20 || v2.MemoryLimit != 512<<20 {
		t.Errorf("cgroup v2 with a CPU limit: %+v", v2)
	}
	v1 := statsOf(resp(map[string]uint64{"total_inactive_file": 10 << 20}), 0)
	if v1.CPUs != 4 || v1.MemoryUsed != 90<<20 || v1.MemoryCache != 10<<20 {
		t.Errorf("cgroup v1 without a CPU limit: %+v", v1)
	}
	if odd := statsOf(resp(map[string]uint64{"inactive_file": 200 << 20}), 0); odd.MemoryUsed != 100<<20 {
		t.Errorf("a cache larger than the usage is not subtracted: %+v", odd)
	}
}
