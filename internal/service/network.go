package service

import (
	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/engine"
)

// Networked reports whether the commands of run (admitted by Admit) get a network: the template's policy,
// narrowed by the caller's block, is not none. A run this process did not admit (a fleet's forwarded one, a
// refused one) reports false: its commands are taken to have none.
func Networked(run *sandkeep.Run) bool {
	if run == nil {
		return false
	}
	r := engine.Facade.Run(run)
	return r != nil && r.Networked()
}

// NoteNetworkUpdate records network_updated in run (admitted by Admit with the new block); a run this process did
// not admit records nothing.
func NoteNetworkUpdate(run *sandkeep.Run, sandbox string) {
	if run == nil {
		return
	}
	if r := engine.Facade.Run(run); r != nil {
		r.NoteNetworkUpdate(sandbox)
	}
}
