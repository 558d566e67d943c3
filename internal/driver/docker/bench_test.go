package docker_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/lifecycle"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// unhardened creates sandboxes without the seccomp profile and the ulimits (the engine's defaults), for the
// benchmark's "off" side only: sandkeep itself has no way to turn them off.
type unhardened struct{ *docker.Driver }

func (u unhardened) Create(ctx context.Context, spec *driver.CreateSpec) (*driver.Sandbox, error) {
	s := *spec
	s.Posture.Seccomp, s.Posture.Ulimits = "", nil
	return u.Driver.Create(ctx, &s)
}

// BenchmarkHardening measures what the hardening of issue 11 costs, side by side in one run: "off" is the
// engine's default seccomp profile and ulimits on a plain workspace bind; "on" is sandkeep's profile, core 0 and
// nofile bounded, and a 1 GiB workspace quota (a loop-mounted ext4). It reports the median first command (a
// new key: create, quota file system, start, `true`), warm `true`, and warm 16 MiB written into /workspace (fsync'd),
// for each side, and the on/off ratios. Blocks alternate the order of the sides.
//
//	SANDKEEP_REQUIRE_DOCKER=1 go test -run '^$' -bench BenchmarkHardening -benchtime 1x ./internal/driver/docker/
func BenchmarkHardening(b *testing.B) {
	testutil.Docker(b)
	image := testutil.TestImage(b)
	agent := testutil.AgentBinary(b)
	const blocks, warm = 6, 15
	type side struct {
		name string
		m    *lifecycle.Manager
		home *lifecycle.Home
		keys []identity.Key

		first, warmTrue, warmWrite []time.Duration
	}
	mk := func(name string, on bool) *side {
		home, err := lifecycle.OpenHome(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		s := &side{name: name, home: home}
		b.Cleanup(func() {
			for _, k := range s.keys {
				_ = s.m.Remove(context.Background(), k, false)
			}
		})
		testutil.Cleanup(b, home.Installation)
		d, err := docker.New(docker.Options{})
		if err != nil {
			b.Fatal(err)
		}
		cfg := lifecycle.Config{Image: image, AgentPath: agent, Transport: lifecycle.TransportAgent}
		var drv driver.Driver = d
		if on {
			cfg.DiskBytes = 1 << 30
		} else {
			drv = unhardened{d}
		}
		m, err := lifecycle.New(home, drv, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { m.Close() })
		s.m = m
		return s
	}
	off, on := mk("off", false), mk("on", true)
	run := func(s *side, key identity.Key, argv ...string) time.Duration {
		start := time.Now()
		res, err := s.m.Exec(b.Context(), key, lifecycle.ExecRequest{Argv: argv, Timeout: time.Minute})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("%s: %q: %v %+v", s.name, argv, err, res)
		}
		return time.Since(start)
	}
	b.ResetTimer()
	for blk := range blocks {
		order := []*side{off, on}
		if blk%2 == 1 {
			order = []*side{on, off}
		}
		for _, s := range order {
			key, err := identity.New("bench", fmt.Sprintf("%s-%d-%d", s.name, blk, time.Now().UnixNano()))
			if err != nil {
				b.Fatal(err)
			}
			s.keys = append(s.keys, key)
			s.first = append(s.first, run(s, key, "true"))
			for range warm {
				s.warmTrue = append(s.warmTrue, run(s, key, "true"))
			}
			for range 3 {
				s.warmWrite = append(s.warmWrite, run(s, key, "sh", "-c", "dd if=/dev/zero of=/workspace/w bs=1M count=16 conv=fsync 2>/dev/null && rm /workspace/w"))
			}
		}
	}
	b.StopTimer()
	med := func(d []time.Duration) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[len(s)/2]
	}
	var rep strings.Builder
	for _, m := range []struct {
		name    string
		off, on []time.Duration
	}{
		{"first_command", off.first, on.first},
		{"warm_true", off.warmTrue, on.warmTrue},
		{"warm_write_16MiB", off.warmWrite, on.warmWrite},
	} {
		o, n := med(m.off), med(m.on)
		ratio := float64(n) / float64(o)
		fmt.Fprintf(&rep, "%-18s off %8.2f ms  on %8.2f ms  on/off %.3f  (n=%d each)\n", m.name,
			float64(o.Microseconds())/1000, float64(n.Microseconds())/1000, ratio, len(m.on))
		b.ReportMetric(ratio, m.name+"_on/off")
	}
	b.Logf("hardening cost, medians over %d blocks:\n%s", blocks, rep.String())
}
