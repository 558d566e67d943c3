package main

import (
	"strings"
	"testing"

	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestExecRuntime: the sandbox of a `sandkeep exec` runs under the runtime the suite was asked for
// (SANDKEEP_TEST_RUNTIME, scripts/test.sh's runsc pass), as the engine reports it, so that pass really runs the
// CLI's commands under gVisor; without one, never under runsc. Under gVisor, a command that asks for a network
// is refused with EGRESS_UNAVAILABLE naming gVisor before it runs, the key's next command runs normally, and
// --transport agent is refused with TRANSPORT_UNAVAILABLE naming gVisor (it has no agent channel).
func TestExecRuntime(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	if c.kc != nil {
		t.Skip("the engine's runtime is a Docker setting; kubernetes runs its own (docs/KUBERNETES.md)")
	}
	tenant := c.ten("acme")
	who := []string{"--tenant", tenant, "--user", "rt"}
	c.run(t, append(append([]string{"exec"}, who...), "--", "true")...).want(t, 0)
	ins, err := testutil.Docker(t).ContainerInspect(t.Context(), keyOf(t, tenant, "rt").ContainerName(), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := ins.Container.HostConfig.Runtime
	switch want := testRuntime(); {
	case want != "" && got != want:
		t.Fatalf("the sandbox's runtime is %q, want %q (SANDKEEP_TEST_RUNTIME)", got, want)
	case want == "" && got == "runsc":
		t.Fatalf("the sandbox runs under runsc with no SANDKEEP_TEST_RUNTIME")
	}
	if !gvisor() {
		return
	}
	r := c.run(t, append(append([]string{"exec"}, who...), "--network", "allowlist", "--allow", "127.0.0.1:9", "--",
		"sh", "-c", "echo ran > /workspace/net-ran")...)
	r.wantFailure(t, "EGRESS_UNAVAILABLE")
	if !strings.Contains(r.stderr, "gVisor") {
		t.Errorf("the refusal does not name gVisor: %s", r.stderr)
	}
	out := c.run(t, append(append([]string{"exec"}, who...), "--", "sh", "-c", "cat /workspace/net-ran 2>/dev/null || echo none")...).want(t, 0)
	if out.stdout != "none\n" {
		t.Errorf("the refused command ran: %q", out.stdout)
	}
	// Nor is there an agent channel: asking for one is refused, saying why.
	r = c.run(t, append(append([]string{"exec", "--transport", "agent"}, who...), "--", "true")...)
	if r.wantFailure(t, "TRANSPORT_UNAVAILABLE"); !strings.Contains(r.stderr, "gVisor") {
		t.Errorf("--transport agent under gVisor does not say why: %s", r.stderr)
	}
}
