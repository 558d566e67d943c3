package docker_test

import (
	"slices"
	"testing"

	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestEngine: the engine says what doctor judges: its version, runc among its runtimes (and runsc when the runsc
// pass registered it), and seccomp among its security options, by name.
func TestEngine(t *testing.T) {
	testutil.Docker(t)
	d, err := docker.New(docker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := d.Engine(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if e.Version == "" || e.APIVersion == "" || e.DefaultRuntime == "" {
		t.Errorf("engine %+v: version, API version and default runtime must be set", e)
	}
	if !slices.Contains(e.Runtimes, "runc") || !slices.IsSorted(e.Runtimes) {
		t.Errorf("runtimes %v: want runc among them, sorted", e.Runtimes)
	}
	if rt := testRuntime(); rt != "" && !slices.Contains(e.Runtimes, rt) {
		t.Errorf("runtimes %v lack the test runtime %s", e.Runtimes, rt)
	}
	if !slices.Contains(e.SecurityOptions, "seccomp") {
		t.Errorf("security options %v: want seccomp, by name", e.SecurityOptions)
	}
}
