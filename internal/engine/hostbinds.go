package engine

import (
	"slices"
	"strings"

	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/events"
)

// dropHostBinds takes the host binds out of a shape's Config for a driver that cannot bind host paths (the
// kubernetes driver), with every variable whose value points into a dropped target (the target itself, a path
// under it, or such a path in a colon-separated list like PATH), so that no command is promised a path that is
// not there. It returns the sandbox_host_binds_dropped event, or nil when the Config had no host binds.
//
// Dropping is the seed's rule for what a driver cannot honour: the run goes on, without the binds, and says so;
// refusing the whole sandbox at create (what the kubernetes driver does with a bind it is handed) would make an
// operator's cache bind a reason no command can run there.
func dropHostBinds(c *lifecycle.Config, driverName string) *events.HostBindsDropped {
	if len(c.Mounts) == 0 {
		return nil
	}
	ev := &events.HostBindsDropped{Driver: driverName}
	for _, m := range c.Mounts {
		ev.Targets = append(ev.Targets, m.Target)
	}
	c.Mounts = nil
	kept := c.Env[:0:0]
	for _, kv := range c.Env {
		k, v, _ := strings.Cut(kv, "=")
		if promises(v, ev.Targets) {
			if !slices.Contains(ev.Withdrawn, k) {
				ev.Withdrawn = append(ev.Withdrawn, k)
			}
			continue
		}
		kept = append(kept, kv)
	}
	c.Env = kept
	slices.Sort(ev.Withdrawn)
	return ev
}

// promises reports whether value names a path at or under one of targets, alone or in a colon-separated list.
func promises(value string, targets []string) bool {
	for _, part := range strings.Split(value, ":") {
		for _, t := range targets {
			if part == t || strings.HasPrefix(part, strings.TrimSuffix(t, "/")+"/") {
				return true
			}
		}
	}
	return false
}
