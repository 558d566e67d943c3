package engine

import "github.com/sandkeep/sandkeep/internal/egress"

// Networked reports whether the run's commands get a network: their policy (the run's, narrowed by the caller's
// block) is not none. A caller that routes commands by it asks after admission: the E2B front runs the commands
// of a sandbox with a network on the exec path, since processes carry none (docs/E2B.md). A refused run has none.
func (r *Run) Networked() bool {
	return r.lc != nil && r.cmdPol != nil && r.cmdPol.Mode != "" && r.cmdPol.Mode != egress.ModeNone
}
