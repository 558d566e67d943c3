package sandkeep_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/drivers"
)

// ExampleManager_Exec runs a command in the persistent sandbox of user alice of tenant acme, streaming its
// output and exiting with its own status. It needs a Docker engine, an image and the agent binary, so it is
// compiled but not run by `go test`.
func ExampleManager_Exec() {
	ctx := context.Background()
	cfg := sandkeep.ConfigFromEnv()                         // SANDKEEP_HOME, SANDKEEP_IMAGE, SANDKEEP_AGENT, SANDKEEP_SANDBOX_DEFAULT...
	cfg.Drivers = []sandkeep.DriverOption{drivers.Docker()} // no host passthrough: nothing runs unsandboxed
	m, err := sandkeep.Open(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	key, err := sandkeep.NewKey("acme", "alice")
	if err != nil {
		log.Fatal(err)
	}
	res, err := m.Exec(ctx, key, sandkeep.ExecRequest{
		Argv:    []string{"sh", "-c", "echo hi > /workspace/f; id -u"},
		Workdir: "src", // /workspace/src, created when missing
		Timeout: 5 * time.Second,
		Stdout:  os.Stdout, // stream as produced; leave nil to collect into res.Stdout
		Stderr:  os.Stderr,
	})
	if err != nil {
		// A failure of sandkeep itself, not of the command: a stable code and a hint.
		log.Fatalf("%s: %v", sandkeep.CodeOf(err), err)
	}
	if res.TimedOut {
		fmt.Fprintf(os.Stderr, "timed out after %v; the process tree was killed\n", 5*time.Second)
	}
	fmt.Printf("exit %d in %s (%s)\n", res.ExitCode, res.Sandbox.Name, res.Sandbox.ID[:12])
	os.Exit(res.ExitCode)
}
