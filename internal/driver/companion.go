package driver

import (
	"context"
	"time"
)

// Companion is one service a compose-based devcontainer.json runs next to the sandbox (runServices): it shares
// the sandbox's network namespace (reachable at localhost from the sandbox, no network of its own) and is
// hardened and bounded like the sandbox itself.
type Companion struct {
	Service     string            // the compose service's name; part of the container's name
	Image       string            // the image ref (already built or present)
	Env         []string          // KEY=VALUE
	Command     []string          // nil: the image's default
	Volumes     []CompanionVolume // named volumes owned by the sandbox's key
	Healthcheck *Healthcheck      // nil: started is ready
	DependsOn   []string          // services started (and healthy, when they have a check) first
}

// CompanionVolume is a named volume of a companion, created per key and removed with the sandbox.
type CompanionVolume struct {
	Name   string // the compose volume's name
	Target string // absolute path in the companion
}

// Healthcheck is a compose healthcheck: Test as the engine takes it (["CMD", ...] or ["CMD-SHELL", "..."]).
type Healthcheck struct {
	Test     []string
	Interval time.Duration
	Timeout  time.Duration
	Retries  int
}

// CompanionRunner is optional: a driver that can run compose companions next to a sandbox. Callers find it
// with a type assertion; drivers without it make compose-based devcontainers fail as unsupported.
//
// EnsureCompanions makes every companion of sb run (creating, recreating when sb was recreated, or starting
// them) with the sandbox's posture p (user, capabilities, seccomp, limits), in depends_on order, waiting for
// each healthcheck. Remove and Stop of a driver with companions remove and stop them with the sandbox.
type CompanionRunner interface {
	EnsureCompanions(ctx context.Context, sb *Sandbox, p Posture, cs []Companion) error
}
