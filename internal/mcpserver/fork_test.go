package mcpserver

import (
	"context"
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
)

// forkBackend is the fake backend that also forks: it records each fork and answers with err when set.
type forkBackend struct {
	*fakeBackend
	forks []forkCall
	err   error
}

type forkCall struct {
	from, to sandkeep.Key
	ar       service.AdmitRequest
}

func (b *forkBackend) Fork(_ context.Context, from, to sandkeep.Key, ar service.AdmitRequest) (sandkeep.Sandbox, error) {
	b.forks = append(b.forks, forkCall{from, to, ar})
	if b.err != nil {
		return sandkeep.Sandbox{}, b.err
	}
	return sandkeep.Sandbox{Tenant: to.Tenant, User: to.User, Name: to.ContainerName(), State: "running", Template: "py"}, nil
}

// TestForkTool: fork_sandbox forks the session's own key into a user of the same tenant (the tool cannot name
// another tenant), passes the backend's codes on, needs the exec scope, and answers SPEC_UNSUPPORTED over a
// backend that cannot fork.
func TestForkTool(t *testing.T) {
	b := &forkBackend{fakeBackend: newFakeBackend(t)}
	alice := mustKey(t, "acme", "alice")
	cs := connect(t, New(b, alice, Options{}))
	out := output[ForkOutput](t, call(t, cs, ToolFork, map[string]any{"to": "bob"}))
	bob := mustKey(t, "acme", "bob")
	if out.User != "bob" || out.Tenant != "acme" || out.Name != bob.ContainerName() || out.Template != "py" || out.State != "running" {
		t.Fatalf("fork_sandbox answered %+v", out)
	}
	if len(b.forks) != 1 || b.forks[0].from != alice || b.forks[0].to != bob {
		t.Fatalf("the backend got %+v", b.forks)
	}
	b.err = fault.New(fault.QuotaExceeded, "remove one", "over")
	wantCode(t, call(t, cs, ToolFork, map[string]any{"to": "carol"}), fault.QuotaExceeded)
	wantCode(t, call(t, cs, ToolFork, map[string]any{"to": ""}), fault.InvalidIdentity)
	if Scope(ToolFork) != "exec" {
		t.Errorf("fork_sandbox needs scope %q, want exec", Scope(ToolFork))
	}

	plain := connect(t, New(newFakeBackend(t), alice, Options{}))
	wantCode(t, call(t, plain, ToolFork, map[string]any{"to": "bob"}), fault.SpecUnsupported)
}
