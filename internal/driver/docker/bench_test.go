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
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/identity"
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

// BenchmarkHardening measures what the hardening of issue 11 costs, side by side in one run: "off" is a sandbox
// as it was before the issue (the engine's default seccomp profile and ulimits, a plain workspace bind, uid 1000
// for every key); "on" is sandkeep's profile, core 0 and nofile bounded, a 1 GiB workspace quota (a loop-mounted
// ext4) and the key's own host uid, both over the agent channel. When the engine has runsc, "on-exec" is "on"
// over the engine's exec and "runsc" is "on" under gVisor (which has only the exec transport), so gVisor's cost
// is read at the same transport. It reports the median first command (a new key: create, quota file system,
// start, `true`), warm `true`, and warm 16 MiB written into /workspace (fsync'd), for each side, and the on/off
// and runsc/on-exec ratios. Each block runs every side once, the order rotating from block to block.
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
	mk := func(name string, on bool, tr lifecycle.Transport, runtime string) *side {
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
		cfg := lifecycle.Config{Image: image, AgentPath: agent, Transport: tr, Runtime: runtime}
		var drv driver.Driver = d
		if on {
			cfg.DiskBytes = 1 << 30
		} else {
			drv, cfg.UIDs = unhardened{d}, lifecycle.UIDsOff
		}
		m, err := lifecycle.New(home, drv, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { m.Close() })
		s.m = m
		return s
	}
	off, on := mk("off", false, lifecycle.TransportAgent, ""), mk("on", true, lifecycle.TransportAgent, "")
	sides := []*side{off, on}
	var onExec, gvisor *side
	if d, err := docker.New(docker.Options{}); err == nil {
		if e, err := d.Engine(b.Context()); err == nil && slices.Contains(e.Runtimes, lifecycle.RuntimeGVisor) {
			onExec = mk("on-exec", true, lifecycle.TransportExec, "")
			gvisor = mk("runsc", true, lifecycle.TransportExec, lifecycle.RuntimeGVisor)
			sides = append(sides, onExec, gvisor)
		}
	}
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
		order := append(slices.Clone(sides[blk%len(sides):]), sides[:blk%len(sides)]...)
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
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	var rep strings.Builder
	for _, pair := range [][2]*side{{off, on}, {onExec, gvisor}} {
		base, other := pair[0], pair[1]
		if base == nil {
			continue
		}
		for _, m := range []struct {
			name        string
			base, other []time.Duration
		}{
			{"first_command", base.first, other.first},
			{"warm_true", base.warmTrue, other.warmTrue},
			{"warm_write_16MiB", base.warmWrite, other.warmWrite},
		} {
			o, n := med(m.base), med(m.other)
			ratio := float64(n) / float64(o)
			unit := other.name + "/" + base.name
			fmt.Fprintf(&rep, "%-18s %-7s %8.2f ms  %-5s %8.2f ms  %s %.3f  (n=%d each)\n", m.name, base.name, ms(o),
				other.name, ms(n), unit, ratio, len(m.other))
			b.ReportMetric(ratio, m.name+"_"+unit)
		}
	}
	b.Logf("hardening cost, medians over %d blocks, order rotating over %d sides:\n%s", blocks, len(sides), rep.String())
}
