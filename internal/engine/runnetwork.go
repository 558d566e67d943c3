package engine

import (
	"slices"

	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/events"
)

// Networked reports whether the run's commands get a network: their policy (the run's, narrowed by the caller's
// block) is not none. A caller that routes commands by it asks after admission: the E2B front runs the commands
// of a sandbox with a network on the exec path, which carries its caller's block (docs/E2B.md). A refused run has none.
func (r *Run) Networked() bool {
	return r.lc != nil && r.cmdPol != nil && r.cmdPol.Mode != "" && r.cmdPol.Mode != egress.ModeNone
}

// NoteNetworkUpdate records in the run that its caller replaced the network block of the sandbox's later
// commands with the run's own (RunRequest.Network, as admitted): network_updated. sandbox names the sandbox in
// the caller's words (the E2B sandbox id).
func (r *Run) NoteNetworkUpdate(sandbox string) {
	ev := events.NetworkUpdated{Sandbox: sandbox}
	if r.cmdNet != nil {
		ev.Mode, ev.Rules = r.cmdNet.Mode, slices.Clone(r.cmdNet.Rules)
	}
	r.event(events.NameNetworkUpdated, ev)
}
