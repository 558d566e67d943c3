package kube_test

import (
	"context"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// TestStats: a running sandbox's stats come from its node's kubelet summary: CPU time that grows with a busy
// loop, memory in use within its limit, the CPUs it may use, its workspace claim's disk where measured; a sandbox whose pod is
// gone is not running (ErrConflict) or not found, as for Exec.
func TestStats(t *testing.T) {
	c := theNode(t)
	ns := c.namespace(t)
	d := c.driver(t, ns)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	key, err := identity.New("acme", "stats")
	if err != nil {
		t.Fatal(err)
	}
	sb := createStarted(t, ctx, d, c.spec(t, ns, key, "kube-stats-"+randHex(t, 4)))
	if r := run(t, ctx, d, sb, "sh", "-c", "head -c 1000000 /dev/zero > blob"); r.exit != 0 {
		t.Fatalf("write: %d %q", r.exit, r.stderr)
	}

	// The kubelet samples its pods every few seconds: wait for a sample, then for one after a busy loop.
	sample := func(after time.Time) driver.Stats {
		t.Helper()
		for {
			st, err := d.Stats(ctx, sb)
			if err == nil && st.At.After(after) {
				return st
			}
			if err != nil && !cerrdefs.IsConflict(err) {
				t.Fatalf("Stats: %v", err)
			}
			select {
			case <-ctx.Done():
				t.Fatalf("no sample after %s (last %+v, %v)", after, st, err)
			case <-time.After(time.Second):
			}
		}
	}
	first := sample(time.Time{})
	if r := run(t, ctx, d, sb, "sh", "-c", "end=$(($(date +%s)+2)); while [ $(date +%s) -lt $end ]; do :; done"); r.exit != 0 {
		t.Fatalf("busy loop: %d %q", r.exit, r.stderr)
	}
	second := sample(first.At)
	t.Logf("first %+v; second %+v", first, second)
	if second.CPUTime <= first.CPUTime || second.CPUTime-first.CPUTime < 500*time.Millisecond {
		t.Errorf("CPU time %s -> %s over a 2s busy loop", first.CPUTime, second.CPUTime)
	}
	if second.CPUs <= 0 || second.MemoryUsed <= 0 || second.MemoryLimit <= 0 || second.MemoryUsed > second.MemoryLimit {
		t.Errorf("limits and memory: %+v", second)
	}
	// The claim's volume plugin may not measure it: the test node's hostPath volumes are not (zero); a
	// measured one holds at least what was written (TestStatsOf reads one).
	if second.DiskTotal != 0 && (second.DiskUsed < 1_000_000 || second.DiskTotal < second.DiskUsed) {
		t.Errorf("disk %d of %d, want at least the 1 MB written to the workspace", second.DiskUsed, second.DiskTotal)
	}

	// The pod deleted behind the driver's back: not running.
	if err := c.api.CoreV1().Pods(ns).Delete(ctx, sb.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitState(t, ctx, d, sb.Name, driver.StateStopped)
	if _, err := d.Stats(ctx, sb); !cerrdefs.IsConflict(err) && !cerrdefs.IsNotFound(err) {
		t.Errorf("Stats of a sandbox without its pod = %v; want not running or not found", err)
	}
}
