package kube_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// kubeletSeccompDir is the test node's kubelet seccomp directory (scripts/k8s-up.sh: --root-dir), where
// deploy/kubernetes/seccomp-profile.yaml's DaemonSet would put the profile on a real node.
const kubeletSeccompDir = "/var/lib/sandkeep-k8s/kubelet/root/seccomp"

// TestSeccompLocalhost: with Seccomp localhost, a sandbox pod and its containers run under sandkeep's own
// profile installed on the node (Localhost, named by its content), a command in it is under seccomp, and
// Hardening reads the node's podPidsLimit (1024 on the test node). Issue 22, Low 11: pods ran under the
// runtime's default profile and doctor said nothing of the pids limit.
func TestSeccompLocalhost(t *testing.T) {
	c := theNode(t)
	ns := c.namespace(t)
	prof := filepath.Join(kubeletSeccompDir, kube.SeccompLocalhostProfile())
	if err := os.MkdirAll(filepath.Dir(prof), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prof, []byte(driver.SeccompProfile()), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := c.k.Options(ns)
	opts.Seccomp = kube.SeccompLocalhost
	d := c.newDriver(t, opts)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	key, err := identity.New("acme", "seccomp")
	if err != nil {
		t.Fatal(err)
	}
	sb := createStarted(t, ctx, d, c.spec(t, ns, key, "kube-seccomp-"+randHex(t, 4)))
	if r := run(t, ctx, d, sb, "grep", "^Seccomp:", "/proc/self/status"); r.exit != 0 || strings.Fields(r.stdout)[1] != "2" {
		t.Fatalf("Seccomp in the sandbox: exit %d %q %q", r.exit, r.stdout, r.stderr)
	}
	pod, err := c.api.CoreV1().Pods(ns).Get(ctx, sb.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := kube.SeccompLocalhostProfile()
	localhost := func(p *corev1.SeccompProfile) bool {
		return p != nil && p.Type == corev1.SeccompProfileTypeLocalhost && p.LocalhostProfile != nil && *p.LocalhostProfile == want
	}
	if !localhost(pod.Spec.SecurityContext.SeccompProfile) {
		t.Errorf("pod seccomp %+v, want Localhost %s", pod.Spec.SecurityContext.SeccompProfile, want)
	}
	for _, ct := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		if ct.SecurityContext == nil || !localhost(ct.SecurityContext.SeccompProfile) {
			t.Errorf("container %s: seccomp %+v, want Localhost %s", ct.Name, ct.SecurityContext, want)
		}
	}

	h := d.Hardening(ctx)
	if h.Seccomp != want || h.PidsErr != nil || len(h.PodPidsLimit) == 0 {
		t.Fatalf("Hardening = %+v", h)
	}
	for node, limit := range h.PodPidsLimit {
		if limit != 1024 {
			t.Errorf("node %s: podPidsLimit %d, want the test node's 1024", node, limit)
		}
	}

	if _, err := kube.New(kube.Options{Seccomp: "unconfined"}); err == nil {
		t.Error("a Seccomp of neither value was accepted")
	}
}
