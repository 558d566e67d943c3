package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// Driver names, as Preference, --driver and Selection use them.
const (
	DriverDocker     = "docker"
	DriverPodman     = "podman" // the Docker API on a Podman socket
	DriverKubernetes = "kubernetes"
	DriverHost       = "host" // the passthrough: runs on the host, isolates nothing
)

// EnvHostKind names the environment variable that forces the host kind.
const EnvHostKind = "SANDKEEP_HOST_KIND"

// Kind is what sort of machine sandkeep runs on; it picks the driver preference order.
type Kind string

// Kinds.
const (
	KindLocal Kind = "local" // a workstation or a VM with a container engine
	KindCloud Kind = "cloud" // a pod in a Kubernetes cluster
)

// HostKind returns SANDKEEP_HOST_KIND when it is set (local or cloud; any other value is an INVALID_ARGUMENT
// error), else cloud when KUBERNETES_SERVICE_HOST is set, else local. getenv is os.Getenv outside tests.
func HostKind(getenv func(string) string) (Kind, error) {
	switch v := getenv(EnvHostKind); v {
	case string(KindLocal), string(KindCloud):
		return Kind(v), nil
	case "":
	default:
		return "", fault.New(fault.InvalidArgument, "set "+EnvHostKind+" to local or cloud, or unset it",
			"invalid host kind %q from %s", v, EnvHostKind)
	}
	if getenv("KUBERNETES_SERVICE_HOST") != "" {
		return KindCloud, nil
	}
	return KindLocal, nil
}

// Preference returns the drivers to try on a host of kind, best first. The host passthrough is always last;
// it is not a sandbox. An unknown kind has no preference (nil).
func Preference(kind Kind) []string {
	switch kind {
	case KindLocal:
		return []string{DriverDocker, DriverPodman, DriverHost}
	case KindCloud:
		return []string{DriverKubernetes, DriverHost}
	}
	return nil
}

// knownDriver reports whether name is a driver sandkeep knows of, on any kind of host.
func knownDriver(name string) bool {
	switch name {
	case DriverDocker, DriverPodman, DriverKubernetes, DriverHost:
		return true
	}
	return false
}

// Candidate is a driver Select may choose. Probe talks to the driver's engine (driver.Driver.Ping) and must
// honour ctx; nil means the driver is usable.
type Candidate struct {
	Name  string
	Probe func(ctx context.Context) error
}

// Selection is the driver Select settled on.
type Selection struct {
	// Driver is the driver's name: a sandboxing driver, DriverHost when no sandboxing driver is usable (or
	// --driver host was given), or "" when not even the host passthrough is.
	Driver string
	// Sandboxing is true when Driver isolates commands; false for the host passthrough and for "".
	Sandboxing bool
}

// ProbeFailure is one driver that could not be used, and why.
type ProbeFailure struct {
	Driver string
	Err    error
}

// NoSandboxError is the obstacle Select reports when no sandboxing driver will be used: every driver tried
// and why it is unusable, or that --driver host asked for none. It is the only obstacle Decide lets mode auto
// degrade on; any other obstacle refuses the run.
type NoSandboxError struct {
	Kind     Kind
	Explicit bool           // --driver host
	Tried    []ProbeFailure // in preference order; includes the host passthrough when it too is unusable
}

func (e *NoSandboxError) Error() string {
	if e.Explicit {
		return "--driver host runs commands on the host, without a sandbox"
	}
	parts := make([]string, 0, len(e.Tried))
	for _, f := range e.Tried {
		parts = append(parts, f.Driver+": "+f.Err.Error())
	}
	return fmt.Sprintf("no sandboxing driver is usable on this %s host (%s)", e.Kind, strings.Join(parts, "; "))
}

// Unwrap returns the probe errors.
func (e *NoSandboxError) Unwrap() []error {
	errs := make([]error, 0, len(e.Tried))
	for _, f := range e.Tried {
		errs = append(errs, f.Err)
	}
	return errs
}

// errNotConfigured is the reason for a preferred driver that the caller offered no Candidate for.
var errNotConfigured = errors.New("not configured in this build")

// DefaultProbeTimeout bounds one driver probe.
const DefaultProbeTimeout = 2 * time.Second

// Selector chooses a driver, probing each candidate once: the first Select that needs a driver's availability
// probes it, concurrent ones wait for that probe, later ones reuse its answer. A success is kept for the
// Selector's lifetime; a failure for FailedProbeTTL, so that a long-lived server started before its engine
// finds the engine once it is up. It is safe for concurrent use.
type Selector struct {
	timeout time.Duration

	mu     sync.Mutex              // guards probes
	probes map[string]*probeResult // by driver name; an entry is never removed
}

// probeResult is one driver's probe, in flight until done is closed; err and at are set before that.
type probeResult struct {
	done chan struct{}
	err  error
	at   time.Time // when the probe ended
}

// FailedProbeTTL is how long a failed probe's answer is kept before the driver is probed again. A successful
// probe is kept for the Selector's lifetime: a driver that later fails fails its commands, it is not dropped.
const FailedProbeTTL = 5 * time.Second

// failedBefore reports whether r is a finished, failed probe that ended before t.
func (r *probeResult) failedBefore(t time.Time) bool {
	select {
	case <-r.done:
		return r.err != nil && r.at.Before(t)
	default:
		return false
	}
}

// NewSelector returns a Selector whose probes each get timeout (DefaultProbeTimeout when not positive).
func NewSelector(timeout time.Duration) *Selector {
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	return &Selector{timeout: timeout, probes: map[string]*probeResult{}}
}

var shared = sync.OnceValue(func() *Selector { return NewSelector(DefaultProbeTimeout) })

// Shared returns the process-wide Selector, with DefaultProbeTimeout.
func Shared() *Selector { return shared() }

// probe returns c's availability, probing at most once per Selector. The caller that probes does so under a
// context detached from its own cancellation and bounded by the probe timeout, so that one caller giving up
// never caches a false "unavailable" for the others; it therefore waits up to the timeout even when its ctx
// ends. Callers that wait for another's probe leave as soon as their ctx ends, with ctx's error (not cached).
func (s *Selector) probe(ctx context.Context, c Candidate) error {
	s.mu.Lock()
	r, ok := s.probes[c.Name]
	if ok && r.failedBefore(time.Now().Add(-FailedProbeTTL)) {
		ok = false // a failed probe is tried again after a while: an engine started later is found
	}
	if ok {
		s.mu.Unlock()
		select {
		case <-r.done:
			return r.err
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	r = &probeResult{done: make(chan struct{})}
	s.probes[c.Name] = r
	s.mu.Unlock()

	r.err = fmt.Errorf("probe of %s did not return", c.Name) // what waiters see if Probe panics
	defer close(r.done)
	r.err = s.run(ctx, c)
	r.at = time.Now()
	return r.err
}

func (s *Selector) run(ctx context.Context, c Candidate) error {
	if c.Probe == nil {
		return errors.New("no probe")
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	err := c.Probe(pctx)
	if err != nil && pctx.Err() != nil {
		return fmt.Errorf("no answer within %v: %w", s.timeout, err)
	}
	return err
}

// Select chooses the driver for a host of kind.
//
// With explicit (--driver) set, only that driver is considered: an unknown name is INVALID_ARGUMENT; a known
// one that is not among candidates, or whose probe fails, is SANDBOX_DRIVER_UNAVAILABLE with the probe's reason
// and a hint (a hard error: it never degrades). --driver host selects the host passthrough, with a
// *NoSandboxError obstacle marking that no sandbox will be used.
//
// Otherwise the drivers of Preference(kind) are probed in order and the first usable sandboxing driver is
// returned with a nil obstacle. When none is usable the host passthrough is returned (if it is a usable
// candidate; Driver "" otherwise) with a *NoSandboxError obstacle that lists every reason: Select never chooses
// the host silently, and Decide is where that obstacle turns into degrade or refuse.
//
// Candidates are keyed by driver name; the name identifies the driver for the Selector's lifetime (the first
// probe of a name is the one remembered). When ctx ends, Select returns ctx's error.
func (s *Selector) Select(ctx context.Context, kind Kind, explicit string, candidates map[string]Candidate) (Selection, error) {
	if explicit != "" {
		return s.selectExplicit(ctx, explicit, candidates)
	}
	order := Preference(kind)
	if order == nil {
		return Selection{}, fault.New(fault.InvalidArgument, "set "+EnvHostKind+" to local or cloud",
			"unknown host kind %q", kind)
	}
	obstacle := &NoSandboxError{Kind: kind}
	for _, name := range order {
		c, ok := candidates[name]
		var err error
		if !ok {
			err = errNotConfigured
		} else if err = s.probe(ctx, c); ctx.Err() != nil {
			return Selection{}, fmt.Errorf("select driver: %w", context.Cause(ctx))
		}
		if err != nil {
			obstacle.Tried = append(obstacle.Tried, ProbeFailure{Driver: name, Err: err})
			continue
		}
		if name == DriverHost {
			return Selection{Driver: DriverHost}, obstacle
		}
		return Selection{Driver: name, Sandboxing: true}, nil
	}
	return Selection{}, obstacle
}

func (s *Selector) selectExplicit(ctx context.Context, name string, candidates map[string]Candidate) (Selection, error) {
	if !knownDriver(name) {
		return Selection{}, fault.New(fault.InvalidArgument, "pass --driver docker, podman, kubernetes or host, or leave it out",
			"unknown driver %q", name)
	}
	hint := fmt.Sprintf("make the %s driver usable, or leave out --driver to let sandkeep choose", name)
	c, ok := candidates[name]
	if !ok {
		return Selection{}, fault.Wrap(errNotConfigured, fault.SandboxDriverUnavailable, hint,
			"driver %s, named with --driver, is not available here", name)
	}
	err := s.probe(ctx, c)
	if ctx.Err() != nil {
		return Selection{}, fmt.Errorf("select driver: %w", context.Cause(ctx))
	}
	if err != nil {
		return Selection{}, fault.Wrap(err, fault.SandboxDriverUnavailable, hint,
			"driver %s, named with --driver, is unavailable: %v", name, err)
	}
	if name == DriverHost {
		return Selection{Driver: DriverHost}, &NoSandboxError{Explicit: true}
	}
	return Selection{Driver: name, Sandboxing: true}, nil
}
