package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	sdk "github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/postgres"
	"github.com/sandkeep/sandkeep/internal/testutil/kubetest"
)

// TestFleetKubeFollow is issue 27's "agents follow their owner" on the real node: two `sandkeep serve`
// replicas, each with its own agent channel address. The replica that owns a user's pod is SIGKILLed; once its
// lease expires the other takes the key over, and the key's next command reaches the pod's agent over the new
// owner's channel (transport "agent"), not through the API server's exec: the new owner announced its address
// to the agent, which dialled it at once instead of the dead replica's address.
func TestFleetKubeFollow(t *testing.T) {
	if !kubetest.Selected() {
		t.Skipf("a kubernetes test: scripts/test.sh's kubernetes stage runs it (%s=%s)", kubetest.EnvDriver, kubetest.Driver)
	}
	dsn := postgresSchema(t)
	c := newCLI(t)
	c.env = append(c.env, "SANDKEEP_STORE="+dsn, "SANDKEEP_DAEMON=off")
	const ttl = 3 * time.Second
	reps, _ := c.fleetWith(t, 2, ttl, "", fleetKubeTemplate)
	tenant := c.ten("kfollow")
	tok := c.createToken(t, tenant, "kfollow", "")
	owner, other := reps[0].client(t, tok.Token), reps[1].client(t, tok.Token)

	exec := func(cl *sdk.Client, command string) *sdk.ExecResult {
		t.Helper()
		res, err := cl.Exec(bounded(t), "u1", sdk.ExecRequest{Command: command, Timeout: time.Minute})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %q: %+v, %v", command, res, err)
		}
		return res
	}
	first := exec(owner, "echo kept > /workspace/f") // replica 0 takes the key and makes the pod
	warm := exec(owner, "true")
	if warm.Transport != "agent" {
		t.Fatalf("a warm command on the pod's maker went by %q; want the agent channel", warm.Transport)
	}

	if err := reps[0].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-reps[0].exited
	killed := time.Now()
	// call: the successful call's wall time (the takeover, the announcement and the command)
	after, tries, call := execAfterTakeover(t, other, "u1", sdk.ExecRequest{Command: "cat /workspace/f", Timeout: time.Minute},
		killed, ttl+5*time.Second, 100*time.Millisecond)
	took := time.Since(killed)
	if after.ExitCode != 0 || after.Stdout != "kept\n" || after.Sandbox.ID != first.Sandbox.ID {
		t.Fatalf("the takeover's command: %+v; want the workspace's file from the same sandbox %s", after, first.Sandbox.ID)
	}
	if after.Transport != "agent" {
		t.Fatalf("the takeover's first command went by %q; want the agent channel (the pod's agent follows its new owner)", after.Transport)
	}
	// The takeover's run, event by event, from the kill: when the new owner adopted the pod (after announcing
	// itself to its agent) and when the command went out over the channel.
	st, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var line strings.Builder
	if runs, err := st.ListRuns(t.Context(), store.RunFilter{Tenant: tenant, User: "u1", Limit: 1}); err == nil && len(runs) == 1 {
		evs, _ := st.ListEvents(t.Context(), store.EventFilter{RunID: runs[0].ID})
		for _, e := range evs {
			fmt.Fprintf(&line, " %s@+%dms", e.Name, e.Time.Sub(killed).Milliseconds())
		}
	}
	next := exec(other, "true")
	if next.Transport != "agent" {
		t.Errorf("the command after the takeover went by %q; want the agent channel", next.Transport)
	}
	t.Logf("takeover %v after the SIGKILL (lease %v, %d tries); the takeover's call (waiting out the lease, claim, adopt, "+
		"announce, command over the new owner's channel) took %v; its run's events from the kill:%s; a warm command ran "+
		"%dms on the agent before the kill, %dms after", took.Round(time.Millisecond), ttl, tries, call.Round(time.Millisecond),
		line.String(), warm.DurationMS, next.DurationMS)
}
