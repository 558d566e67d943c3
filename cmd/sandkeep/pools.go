package main

import (
	"context"
	"fmt"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/pools"
)

// warmPools starts the templates' warm pools of a long-lived process (serve, the daemon; replica: one replica of
// a fleet). A pool that cannot start is reported and the process serves on: new keys then get their sandboxes
// made on demand.
func warmPools(ctx context.Context, g *globals, m *sandkeep.Manager, replica bool) {
	warm := pools.Warm
	if replica {
		warm = pools.WarmReplica
	}
	ok, err := warm(ctx, m)
	switch {
	case err != nil:
		fmt.Fprintf(g.stderr, "sandkeep: warm pools not started: %v\n", err)
	case ok:
		for _, p := range pools.List(m) {
			fmt.Fprintf(g.stderr, "sandkeep: warm pool %s: %d sandboxes kept ready\n", p.Template, p.Size)
		}
	}
}
