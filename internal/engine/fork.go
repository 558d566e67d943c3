package engine

import (
	"context"

	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// ForkLimits bound what a fork may copy (regular files' bytes, entries in all); zero is no bound. The new key's
// template's workspace quota (resources.disk) bounds it too.
type ForkLimits = lifecycle.ForkLimits

// Fork makes rr.Key a new sandbox with a copy of from's workspace and from's template, from left running. It
// goes through admission as a command of rr.Key would (rr's mode, trust, driver, caller tier; the run is recorded
// with its verdict and ends with the fork), so a fork is allowed exactly where that key's first command would be.
// rr.Template must be "" or from's own: a fork keeps its source's template. A source without a sandbox is
// SANDBOX_NOT_FOUND, a target that has one (or a workspace) SANDBOX_EXISTS, a copy past lim or the template's
// workspace quota QUOTA_EXCEEDED; a refused fork leaves nothing of the new key.
func (m *Manager) Fork(ctx context.Context, from Key, rr RunRequest, lim ForkLimits) (Sandbox, error) {
	if rr.RunID != "" {
		return Sandbox{}, fault.New(fault.InvalidArgument, "fork without a run id: a fork is a run of the new user's own",
			"a fork cannot attach to run %s", rr.RunID)
	}
	if from.Hex() == rr.Key.Hex() {
		return Sandbox{}, fault.New(fault.InvalidArgument, "name another user to fork into", "cannot fork %s into itself", from)
	}
	src, err := m.Sandbox(ctx, from)
	if err != nil {
		return Sandbox{}, err
	}
	switch {
	case rr.Template == "":
		rr.Template = src.Template
	case rr.Template != src.Template:
		return Sandbox{}, fault.New(fault.InvalidArgument, "leave the template out: the copy runs in its source's template",
			"%s runs template %q, not %q", from, src.Template, rr.Template)
	}
	primary, err := m.primary(ctx)
	if err != nil {
		return Sandbox{}, err
	}
	run, err := m.Admit(ctx, rr)
	if err != nil {
		return Sandbox{}, err
	}
	if run.lc != primary { // the source lives on the primary driver; a copy elsewhere would not be a fork
		err = fault.New(fault.SpecUnsupported, "fork on the driver the source runs on (drop --driver, or mode none)",
			"%s's sandbox is on %s and the fork was admitted to %s", from, primary.Driver().Name(), run.Driver)
		run.Finish(err)
		return Sandbox{}, err
	}
	_, err = run.lc.Fork(ctx, from, rr.Key, run.shape, lifecycle.ForkOptions{Limits: lim, OnEvent: run.sink})
	run.Finish(err)
	if err != nil {
		return Sandbox{}, err
	}
	return m.Sandbox(ctx, rr.Key)
}
