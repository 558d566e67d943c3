package kube

import (
	"slices"

	"github.com/sandkeep/sandkeep/internal/driver"
)

var _ driver.PostureHasher = (*Driver)(nil)

// PostureHash implements driver.PostureHasher: the posture without its mounts' host paths. A pod mounts its claim,
// the agent's emptyDir and memory volumes at the mounts' targets and binds no host path, so the sources (under
// each process's state home) say nothing of the pod: without this, every replica of a fleet, each with its own
// home, would read another's pods as drifted and recycle them at a takeover.
func (d *Driver) PostureHash(p driver.Posture) string {
	p.Mounts = slices.Clone(p.Mounts)
	for i := range p.Mounts {
		p.Mounts[i].Source = ""
	}
	return p.Hash()
}
