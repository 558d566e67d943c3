package sandkeep_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/doctor"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// A template's requests are checked when the Manager opens: a request above the limit it sits beside (or
// below zero) is the operator's mistake, refused with its fix before any sandbox exists.
func TestTemplateRequestsChecked(t *testing.T) {
	for name, tc := range map[string]struct {
		t  sandkeep.Template
		ok bool
	}{
		"below the limits":           {sandkeep.Template{CPUs: 0.5, MemoryBytes: 256 << 20, Requests: sandkeep.Requests{CPUs: 0.01, MemoryBytes: 16 << 20}}, true},
		"equal to the limits":        {sandkeep.Template{CPUs: 0.5, MemoryBytes: 256 << 20, Requests: sandkeep.Requests{CPUs: 0.5, MemoryBytes: 256 << 20}}, true},
		"under the Config's default": {sandkeep.Template{Requests: sandkeep.Requests{CPUs: 0.05, MemoryBytes: 128 << 20}}, true},
		"cpus above the limit":       {sandkeep.Template{CPUs: 0.5, Requests: sandkeep.Requests{CPUs: 1}}, false},
		"memory above the default":   {sandkeep.Template{Requests: sandkeep.Requests{MemoryBytes: 3 << 30}}, false},
		"negative":                   {sandkeep.Template{Requests: sandkeep.Requests{CPUs: -1}}, false},
		"negative suspend_after":     {sandkeep.Template{SuspendAfter: -time.Minute}, false},
	} {
		t.Run(name, func(t *testing.T) {
			agent := filepath.Join(t.TempDir(), "sandkeep-agent") // Open looks for it; nothing runs it here
			if err := os.WriteFile(agent, []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			m, err := sandkeep.Open(t.Context(), sandkeep.Config{Home: t.TempDir(), Image: "unused", AgentPath: agent,
				Templates: map[string]sandkeep.Template{"small": tc.t}})
			if m != nil {
				_ = m.Close()
			}
			if tc.ok && err != nil {
				t.Fatalf("Open: %v", err)
			}
			if !tc.ok && fault.CodeOf(err) != fault.InvalidArgument {
				t.Fatalf("Open: %v, want %s naming the template's requests", err, fault.InvalidArgument)
			}
		})
	}
}

// densityTemplate is issue 27's small template: it may use half a core and 256 MiB but requests 0.05 of a core
// and 128 MiB (`requests: {cpus: 0.05, memory: 128m}`). Forty of its sandboxes would need 20 cores as Guaranteed
// pods; by their requests they fill a two-core node exactly (40 x 50m = 2000m).
var densityTemplate = sandkeep.Template{CPUs: 0.5, MemoryBytes: 256 << 20, Requests: sandkeep.Requests{CPUs: 0.05, MemoryBytes: 128 << 20}}

// Idle sandboxes cost what their template requests, not what it may use. On kubernetes: 40 sandboxes of a small
// template run at once on the two-core test node, each pod requesting the template's requests under its limits.
// On Docker, which schedules nothing, the requests are the containers' CPU weight and memory reservation.
func TestDensity(t *testing.T) {
	cfg := baseConfig(t)
	cfg.Templates = map[string]sandkeep.Template{"small": densityTemplate}
	s := newSuite(t, cfg)
	n := 3
	if onKube {
		n = 40
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	keys := make([]sandkeep.Key, n)
	errs := make(chan error, n)
	sem := make(chan struct{}, 8)
	for i := range keys {
		keys[i] = s.key("density", fmt.Sprintf("u%02d", i))
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			res, err := s.m.ExecWith(ctx, sandkeep.RunRequest{Key: keys[i], Template: "small"},
				sandkeep.ExecRequest{Argv: []string{"echo", "ok"}})
			if err == nil && (res.ExitCode != 0 || res.Stdout != "ok\n") {
				err = fmt.Errorf("exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
			}
			if err != nil {
				err = fmt.Errorf("%s: %w", keys[i], err)
			}
			errs <- err
		}()
	}
	for range keys {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		return
	}
	// doctor's "capacity": the room holds at least the n small sandboxes that run, and fewer of the Config's
	// own shape, which reserves its limits.
	c, err := doctor.ViewsOf(s.m).Capacity(ctx, s.driverName())
	if err != nil || c == nil || len(c.Shapes) != 2 {
		t.Fatalf("Capacity: %+v, %v; want the default shape and the template", c, err)
	}
	if def, small := c.Shapes[0], c.Shapes[1]; small.Template != "small" || small.CPUs != 0.05 || small.Fits < int64(n) || def.Fits >= small.Fits {
		t.Errorf("Capacity %+v: want the small template's 0.05 CPU fitting at least %d times, more than the default shape", c, n)
	}
	if !onKube {
		for _, sb := range s.containersOf(s.m) {
			hc := s.inspect(sb.ID).HostConfig
			if hc.CPUShares != 51 || hc.MemoryReservation != 128<<20 || hc.NanoCPUs != 5e8 || hc.Memory != 256<<20 {
				t.Errorf("container %s: cpu shares %d, memory reservation %d, nano cpus %d, memory %d; want 51, 128 MiB, 0.5 CPU, 256 MiB",
					sb.ID, hc.CPUShares, hc.MemoryReservation, hc.NanoCPUs, hc.Memory)
			}
		}
		if got := len(s.containersOf(s.m)); got != n {
			t.Errorf("%d containers for %d keys", got, n)
		}
		return
	}
	pods, err := s.kc.API.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		running++
		r := p.Spec.Containers[0].Resources
		if !r.Requests.Cpu().Equal(resource.MustParse("50m")) || !r.Limits.Cpu().Equal(resource.MustParse("500m")) ||
			!r.Requests.Memory().Equal(*resource.NewQuantity(128<<20, resource.BinarySI)) || p.Status.QOSClass != corev1.PodQOSBurstable {
			t.Errorf("pod %s: requests %v, limits %v, QoS %s; want the template's requests under its limits (Burstable)",
				p.Name, r.Requests, r.Limits, p.Status.QOSClass)
		}
	}
	if running != n {
		t.Errorf("%d sandbox pods running at once, want %d", running, n)
	}
	t.Logf("%d sandboxes of a 0.5-CPU template running at once on the test node, each requesting 50m CPU and 128 MiB; doctor's capacity: %s, %d node(s), %d of them fit",
		running, c.Source, c.Nodes, c.Shapes[1].Fits)
}
