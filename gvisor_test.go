package sandkeep_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
)

// TestGVisorRefusesNetwork: under gVisor a command that asks for a network is refused with EGRESS_UNAVAILABLE
// and a hint, before it runs (the proxy's host socket cannot be reached there: docs/SECURITY.md, "gVisor"); the
// same key's commands without a network keep working. It runs in scripts/test.sh's runsc pass only
// (SANDKEEP_TEST_RUNTIME=runsc), where the egress suite itself cannot apply.
func TestGVisorRefusesNetwork(t *testing.T) {
	if os.Getenv("SANDKEEP_TEST_RUNTIME") != "runsc" {
		t.Skip("the runsc pass only (SANDKEEP_TEST_RUNTIME=runsc, scripts/test.sh)")
	}
	t.Parallel()
	s := newSuite(t, baseConfig(t))
	key := s.key("acme", "gvisor-net")
	s.sh(key, "true")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := s.m.ExecWith(ctx, sandkeep.RunRequest{Key: key, Network: &sandkeep.Network{Mode: "allowlist", Rules: []string{"127.0.0.1:9"}}}, sandkeep.ExecRequest{
		Argv: []string{"sh", "-c", "echo ran > /workspace/net-ran"},
	})
	if sandkeep.CodeOf(err) != "EGRESS_UNAVAILABLE" || !strings.Contains(err.Error(), "gVisor") {
		t.Fatalf("networked command under runsc: result %+v, err %v; want EGRESS_UNAVAILABLE naming gVisor", res, err)
	}
	if out := s.sh(key, "cat /workspace/net-ran 2>/dev/null || echo none"); trim(out) != "none" {
		t.Errorf("the refused command ran: %q", out)
	}
	if out := s.sh(key, "echo ok"); trim(out) != "ok" {
		t.Errorf("the next command without a network: %q", out)
	}
}
