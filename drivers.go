package sandkeep

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/host"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/policy"
)

// Driver makes and runs sandboxes: the Docker engine, a Kubernetes cluster, the host passthrough. Library users
// get one from package github.com/sandkeep/sandkeep/drivers and offer it in Config.Drivers.
type Driver = driver.Driver

// DriverOption offers one driver to admission. Name is how policy knows it (docker, podman, kubernetes, host;
// the host kind's preference order ranks them). New makes the driver, at most once per Manager, the first time
// admission needs to know whether it is usable; the driver it returns is probed (Ping) once and, when selected,
// is the one every sandbox of that name runs on: one engine client per process.
type DriverOption struct {
	Name string
	New  func(DriverEnv) (Driver, error)
}

// DriverEnv is what a driver's constructor may need of the Manager's Config.
type DriverEnv struct {
	AgentPath   string        // the static agent binary on the host
	PullTimeout time.Duration // bound on an image pull; zero: the driver's default
}

// HostDriver offers the host passthrough: commands run on the host itself, unsandboxed, only where policy allows
// it (mode none, or mode auto for a trusted run when no sandboxing driver is usable). Leave it out of
// Config.Drivers and nothing ever runs outside a sandbox.
func HostDriver() DriverOption {
	return DriverOption{Name: DriverHost, New: func(env DriverEnv) (Driver, error) {
		if err := CheckAgent(env.AgentPath); err != nil {
			return nil, err
		}
		return host.New(env.AgentPath), nil
	}}
}

// HostDriverAs is HostDriver with every command run as the host user uid:gid (never 0) and each workspace
// handed to it: the only host passthrough a multi-tenant server offers (sandkeep serve's host_passthrough.user).
func HostDriverAs(uid, gid uint32) DriverOption {
	return DriverOption{Name: DriverHost, New: func(env DriverEnv) (Driver, error) {
		if err := CheckAgent(env.AgentPath); err != nil {
			return nil, err
		}
		return host.NewAs(env.AgentPath, uid, gid)
	}}
}

// driverSet is the Manager's offered drivers: each made once, on first need, and probed once by the selector.
type driverSet struct {
	env   DriverEnv
	order []string // the names offered, in Config order (for error messages)

	mu   sync.Mutex              // guards made
	opts map[string]DriverOption // by name; fixed at Open
	made map[string]*madeDriver  // by name; an entry is never removed
}

// madeDriver is one driver's construction, done once.
type madeDriver struct {
	once   sync.Once
	d      Driver
	err    error
	closed bool // guarded by driverSet.mu
}

func newDriverSet(opts []DriverOption, env DriverEnv) (*driverSet, error) {
	s := &driverSet{env: env, opts: map[string]DriverOption{}, made: map[string]*madeDriver{}}
	for _, o := range opts {
		if o.Name == "" || o.New == nil {
			return nil, fault.New(fault.InvalidArgument, "offer drivers from package sandkeep/drivers, or sandkeep.HostDriver()",
				"a DriverOption needs a Name and a New function")
		}
		if _, dup := s.opts[o.Name]; dup {
			return nil, fault.New(fault.InvalidArgument, "offer each driver once", "driver %q is offered twice", o.Name)
		}
		s.opts[o.Name] = o
		s.order = append(s.order, o.Name)
	}
	return s, nil
}

// get makes (once) and returns the driver called name.
func (s *driverSet) get(name string) (Driver, error) {
	s.mu.Lock()
	o, ok := s.opts[name]
	md := s.made[name]
	if ok && md == nil {
		md = &madeDriver{}
		s.made[name] = md
	}
	s.mu.Unlock()
	if !ok {
		return nil, fault.New(fault.SandboxDriverUnavailable, "offer it in Config.Drivers (the CLI and server offer docker, podman and host)",
			"driver %s is not offered to this sandkeep", name)
	}
	md.once.Do(func() {
		md.d, md.err = o.New(s.env)
		if md.err != nil && fault.CodeOf(md.err) == "" {
			md.err = fault.Wrap(md.err, fault.DriverUnavailable, "check the driver's configuration (DOCKER_HOST, the socket)",
				"cannot set up the %s driver", name)
		}
	})
	return md.d, md.err
}

// close closes every driver made that is an io.Closer, once; a driver not made yet never will be.
func (s *driverSet) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	for _, md := range s.made {
		md.once.Do(func() { // not made yet (or being made: this waits for it)
			md.err = fault.New(fault.DriverUnavailable, "open a new Manager", "the Manager is closed")
		})
		if c, ok := md.d.(io.Closer); ok && md.err == nil && !md.closed {
			md.closed = true
			err = errors.Join(err, c.Close())
		}
	}
	return err
}

// candidates are the offered drivers as the selector probes them: made, then pinged.
func (s *driverSet) candidates() map[string]policy.Candidate {
	out := make(map[string]policy.Candidate, len(s.opts))
	for name := range s.opts {
		out[name] = policy.Candidate{Name: name, Probe: func(ctx context.Context) error {
			d, err := s.get(name)
			if err != nil {
				return err
			}
			return d.Ping(ctx)
		}}
	}
	return out
}
