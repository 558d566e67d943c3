package kube_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep/internal/identity"
)

// TestBenchmark measures, side by side in one run on the node, in blocks that rotate the order: a warm command
// over the agent channel and the same through the API server's exec (one pod; a second driver without the
// channel), the first command for a new key
// (record, claim, pod, exec), and a bare restricted pod created and polled until Running. It prints medians and
// ratios (docs/BENCHMARKS.md). Opt in with SANDKEEP_KUBE_BENCH=1; SANDKEEP_KUBE_BENCH_BLOCKS (default 5).
func TestBenchmark(t *testing.T) {
	if os.Getenv("SANDKEEP_KUBE_BENCH") != "1" {
		t.Skip("set SANDKEEP_KUBE_BENCH=1 (with SANDKEEP_REQUIRE_KUBE=1) to run the benchmark")
	}
	blocks := 5
	if n, err := strconv.Atoi(os.Getenv("SANDKEEP_KUBE_BENCH_BLOCKS")); err == nil && n > 0 {
		blocks = n
	}
	const warmPerBlock = 10
	c := theNode(t)
	ns := c.namespace(t)
	d := c.driver(t, ns)
	dx := c.driverExec(t, ns) // the same pods, every command through the API server
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	inst := "kube-bench-" + randHex(t, 4)
	key, err := identity.New("bench", "warm")
	if err != nil {
		t.Fatal(err)
	}
	warm := createStarted(t, ctx, d, c.spec(t, ns, key, inst))
	run(t, ctx, d, warm, "true")  // the channel's first command
	run(t, ctx, dx, warm, "true") // the first exec sets up the client's connections

	samples := map[string][]time.Duration{}
	scenarios := map[string]func(i, b int){
		"warm exec (API server)": func(int, int) {
			for range warmPerBlock {
				start := time.Now()
				if r := run(t, ctx, dx, warm, "true"); r.exit != 0 {
					t.Fatalf("warm exec: %+v", r)
				}
				samples["warm exec (API server)"] = append(samples["warm exec (API server)"], time.Since(start))
			}
		},
		"warm exec (channel)": func(int, int) {
			for range warmPerBlock {
				start := time.Now()
				r, via := runVia(t, ctx, d, warm, "true")
				if r.exit != 0 {
					t.Fatalf("warm exec over the channel: %+v", r)
				}
				samples["warm exec (channel)"] = append(samples["warm exec (channel)"], time.Since(start))
				if !via {
					t.Fatal("a warm command did not go over the channel")
				}
			}
		},
		"first command, new key": func(i, b int) {
			k, err := identity.New("bench", fmt.Sprintf("first-%d-%d", b, i))
			if err != nil {
				t.Fatal(err)
			}
			spec := c.spec(t, ns, k, inst)
			spec.Image = testImage
			start := time.Now()
			id, err := d.ResolveImage(ctx, testImage)
			if err != nil {
				t.Fatal(err)
			}
			spec.ImageID = id
			sb, err := d.Create(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Start(ctx, sb); err != nil {
				t.Fatal(err)
			}
			if r := run(t, ctx, d, sb, "true"); r.exit != 0 {
				t.Fatalf("first exec: %+v", r)
			}
			samples["first command, new key"] = append(samples["first command, new key"], time.Since(start))
			if err := d.Remove(ctx, sb); err != nil {
				t.Fatal(err)
			}
		},
		"bare pod to Running": func(i, b int) {
			name := fmt.Sprintf("bare-%d-%d", b, i)
			start := time.Now()
			if _, err := c.api.CoreV1().Pods(ns).Create(ctx, barePod(name), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			for {
				p, err := c.api.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
				if err == nil && p.Status.Phase == corev1.PodRunning {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("bare pod never ran: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			samples["bare pod to Running"] = append(samples["bare pod to Running"], time.Since(start))
			zero := int64(0)
			_ = c.api.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		},
	}
	order := []string{"warm exec (API server)", "first command, new key", "bare pod to Running", "warm exec (channel)"}
	for b := range blocks {
		for i := range order {
			name := order[(i+b)%len(order)]
			scenarios[name](i, b)
		}
	}
	med := map[string]time.Duration{}
	var out strings.Builder
	fmt.Fprintf(&out, "kubernetes driver, %d blocks (order rotated), medians:\n", blocks)
	for _, name := range order {
		s := slices.Clone(samples[name])
		slices.Sort(s)
		med[name] = s[len(s)/2]
		fmt.Fprintf(&out, "  %-26s %8.1f ms  (n=%d, min %.1f, max %.1f)\n", name, ms(med[name]), len(s), ms(s[0]), ms(s[len(s)-1]))
	}
	fmt.Fprintf(&out, "  first command / bare pod to Running: %.2fx\n", float64(med[order[1]])/float64(med[order[2]]))
	fmt.Fprintf(&out, "  first command / warm exec:           %.1fx\n", float64(med[order[1]])/float64(med[order[0]]))
	fmt.Fprintf(&out, "  warm exec, API server / channel:     %.1fx\n", float64(med[order[0]])/float64(med[order[3]]))
	t.Log("\n" + out.String())
	fmt.Print(out.String())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// barePod is the smallest restricted pod: the test image's sleep, nothing of sandkeep's.
func barePod(name string) *corev1.Pod {
	f, t := false, true
	uid := int64(1000)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"io.sandkeep.bench": "bare"}},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: &f,
			RestartPolicy:                corev1.RestartPolicyNever,
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: &t, RunAsUser: &uid, RunAsGroup: &uid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name: "c", Image: testImage, Command: []string{"sleep", "3600"}, ImagePullPolicy: corev1.PullIfNotPresent,
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: &f, ReadOnlyRootFilesystem: &t,
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
		},
	}
}
