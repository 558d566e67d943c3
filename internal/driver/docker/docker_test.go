package docker_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/driver/drivertest"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The shared Docker client keeps idle HTTP connections for the whole test process.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
	)
}

// TestConformance runs the driver conformance suite against the real Docker daemon, with the posture the
// lifecycle really applies.
func TestConformance(t *testing.T) {
	testutil.Docker(t)
	image := testutil.TestImage(t)
	agent := testutil.AgentBinary(t)
	drvr, err := docker.New(docker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	drivertest.Run(t, drivertest.Harness{
		New:          func(t *testing.T) driver.Driver { return drvr },
		Image:        image,
		MissingImage: "localhost:1/sandkeep-missing:none",
		Spec: func(t *testing.T, key identity.Key, installation string) *driver.CreateSpec {
			testutil.Cleanup(t, installation)
			return specFor(t, key, installation, agent)
		},
	})
}

func specFor(t *testing.T, key identity.Key, installation, agent string) *driver.CreateSpec {
	t.Helper()
	home, err := lifecycle.OpenHome(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	agentDir, err := home.InstallAgent(agent)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := home.EnsureWorkspace(key, 1000, 1000)
	if err != nil {
		t.Fatal(err)
	}
	p, err := lifecycle.BuildPosture(lifecycle.Config{Image: "unused", AgentPath: agent, Runtime: testRuntime()}, ws, agentDir, "")
	if err != nil {
		t.Fatal(err)
	}
	return &driver.CreateSpec{
		Key: key, Name: key.ContainerName(), Posture: p,
		Labels: map[string]string{
			driver.LabelInstallation: installation, driver.LabelKey: key.Hex(),
			driver.LabelTenant: key.Tenant, driver.LabelUser: key.User, driver.LabelPosture: p.Hash(),
		},
	}
}
