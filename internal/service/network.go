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
