package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/testutil/kubetest"
)

// TestDoctorCapacityKube: `sandkeep doctor` on the two-core test node explains its capacity in sandboxes: the
// node's allocatable room, and how many sandboxes of the default shape (which reserves its limits) and of a small
// template (`requests: {cpus: 0.05, memory: 128m}`, issue 27) it holds: forty of the small one.
func TestDoctorCapacityKube(t *testing.T) {
	if !kubetest.Selected() {
		t.Skipf("a kubernetes test: scripts/test.sh's kubernetes stage runs it (%s=%s)", kubetest.EnvDriver, kubetest.Driver)
	}
	c := newCLI(t)
	conf := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	if err := os.WriteFile(conf, []byte("templates:\n  small: {cpus: 0.5, memory: 256m, requests: {cpus: 0.05, memory: 128m}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := c.runWith(t, nil, []string{"SANDKEEP_CONFIG=" + conf}, "doctor")
	var line string
	for l := range strings.SplitSeq(r.stdout, "\n") {
		if strings.Contains(l, "capacity") {
			line = squash(l)
		}
	}
	for _, want := range []string{"PASS capacity", "1 node(s), the cluster's Ready, schedulable nodes (allocatable): 2 CPUs",
		"small 40 sandboxes (each reserves 0.05 CPU, 128MiB)"} {
		if !strings.Contains(line, want) {
			t.Errorf("doctor's capacity line lacks %q: %q\n%s", want, line, r.stdout)
		}
	}
	t.Logf("%s", line)
}
