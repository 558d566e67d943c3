package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/gofrs/flock"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Info is what `ps` shows of one sandbox.
type Info struct {
	Key       identity.Key
	Name      string
	ID        string
	State     driver.State
	Image     string
	Template  string // the operator template it was made for; "" for none
	CreatedAt time.Time
	LastUsed  time.Time // zero when never used
	IdleFor   time.Duration
	Disk      *Usage // the workspace quota's use; nil without a quota (or when its file system is not mounted)
}

// Info describes key's sandbox (one inspect); none is SANDBOX_NOT_FOUND, and so is a container of that name that
// is not this installation's: like List, Info does not describe what is not ours.
func (m *Manager) Info(ctx context.Context, key identity.Key) (Info, error) {
	sb, err := m.owned(ctx, key)
	if fault.Is(err, fault.ForeignContainer) {
		err = errNoSandbox(key)
	}
	if err != nil {
		return Info{}, err
	}
	return m.info(key, sb), nil
}

// info describes sb, the sandbox of key.
func (m *Manager) info(key identity.Key, sb *driver.Sandbox) Info {
	created, _ := time.Parse(time.RFC3339, sb.Labels[driver.LabelCreatedAt])
	used := m.home.LastUsed(key)
	idleFrom := used
	if idleFrom.IsZero() {
		idleFrom = created
	}
	return Info{
		Key: key, Name: sb.Name, ID: sb.ID, State: sb.State, Image: sb.Labels[driver.LabelImage],
		Template: sb.Labels[driver.LabelTemplate], CreatedAt: created, LastUsed: used,
		IdleFor: max(0, m.cfg.Now().Sub(idleFrom)).Round(time.Second), Disk: m.diskUsage(key),
	}
}

// diskUsage is key's workspace usage when it is on a quota file system of its own (two stats), else nil. Any shape
// may have set the quota, so the mount is what says.
func (m *Manager) diskUsage(key identity.Key) *Usage {
	if u, ok := m.home.WorkspaceUsage(key); ok {
		return &u
	}
	return nil
}

// List returns every sandbox of this installation, sorted by tenant then user. Containers whose labels do
// not make a valid key are left out (they are not ours to describe).
func (m *Manager) List(ctx context.Context) ([]Info, error) {
	sbs, err := m.drv.List(ctx, m.home.Installation)
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(sbs))
	for _, sb := range sbs {
		if key, ok := m.keyOf(sb); ok {
			out = append(out, m.info(key, sb))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key.Tenant != out[j].Key.Tenant {
			return out[i].Key.Tenant < out[j].Key.Tenant
		}
		return out[i].Key.User < out[j].Key.User
	})
	return out, nil
}

// keyOf rebuilds a sandbox's key from its labels and checks it against the key label and the name.
func (m *Manager) keyOf(sb *driver.Sandbox) (identity.Key, bool) {
	if sb.Labels[driver.LabelPool] != "" {
		return m.claimantOf(sb) // pool.go: a claimed member is its key's; an unclaimed one is nobody's
	}
	key, err := identity.New(sb.Labels[driver.LabelTenant], sb.Labels[driver.LabelUser])
	if err != nil || key.Hex() != sb.Labels[driver.LabelKey] || key.ContainerName() != sb.Name ||
		sb.Labels[driver.LabelInstallation] != m.home.Installation {
		return identity.Key{}, false
	}
	return key, true
}

// SweepReport says what one sweep pass did.
type SweepReport struct {
	Stopped   []string // sandbox names stopped for idleness
	Suspended []string // sandbox names suspended (suspend.go): removed, their workspaces kept
	Removed   []string // sandbox names removed past retention
	Skipped   []string // busy keys left alone
}

// SweepOnce suspends sandboxes idle past their template's SuspendAfter, stops those idle past IdleTimeout and
// removes stopped ones past Retention. It only
// try-locks gates: a key with a command running or queued is skipped, never waited for.
func (m *Manager) SweepOnce(ctx context.Context) (SweepReport, error) {
	var rep SweepReport
	sbs, err := m.drv.List(ctx, m.home.Installation)
	if err != nil {
		return rep, err
	}
	var errs []error
	for _, sb := range sbs {
		key, ok := m.keyOf(sb)
		if !ok {
			continue
		}
		if err := m.sweepOne(ctx, key, sb, &rep); err != nil {
			errs = append(errs, err)
		}
	}
	return rep, errors.Join(errs...)
}

func (m *Manager) sweepOne(ctx context.Context, key identity.Key, listed *driver.Sandbox, rep *SweepReport) error {
	if !m.suspendable(key, listed) && !m.sweepable(ctx, key, listed) {
		return nil
	}
	release, ok := m.gates.tryAcquire(key)
	if !ok {
		rep.Skipped = append(rep.Skipped, listed.Name)
		return nil
	}
	defer release()
	// Under the gate, look again: another process may have used or changed the sandbox since the list.
	sb, err := m.drv.Inspect(ctx, listed.Name) // by name, as the contract says; then make sure it is the same one
	if cerrdefs.IsNotFound(err) {
		return nil // removed since the list
	}
	if err != nil {
		return fmt.Errorf("sweep %s: %w", listed.Name, err)
	}
	if sb.ID != listed.ID {
		return nil
	}
	if m.suspendable(key, sb) { // suspend.go: before idle stop, which would only stop it
		return m.suspend(ctx, key, sb, rep, events.SuspendIdle)
	}
	if !m.sweepable(ctx, key, sb) {
		return nil
	}
	m.forget(key)
	m.dropEgress(key)
	m.dropServices(key)
	switch sb.State {
	case driver.StateRunning:
		if err := m.drv.Stop(ctx, sb, m.cfg.StopGrace); err != nil {
			return fmt.Errorf("sweep: %w", err)
		}
		rep.Stopped = append(rep.Stopped, sb.Name)
		m.emit(ctx, events.NameSandboxStoppedIdle, events.SandboxStoppedIdle{Sandbox: sb.Name,
			IdleMS: m.cfg.Now().Sub(m.home.LastUsed(key)).Milliseconds()})
		m.cfg.Logger.Info("sweeper stopped idle sandbox", "sandbox", sb.Name, "key", key.Short())
	default:
		if m.pausesOnRetention(sb) { // its time ran out: paused (suspended), not removed
			return m.suspend(ctx, key, sb, rep, events.SuspendRetention)
		}
		if err := m.drv.Remove(ctx, sb); err != nil {
			return fmt.Errorf("sweep: %w", err)
		}
		m.home.ForgetKey(key)
		m.dropListener(key)
		if m.cfg.RemoveWorkspace {
			if err := m.removeWorkspace(ctx, key, sb); err != nil { // a kubernetes claim too
				return fmt.Errorf("sweep: %w", err)
			}
		}
		rep.Removed = append(rep.Removed, sb.Name)
		m.emit(ctx, events.NameSandboxRemoved, events.SandboxRemoved{Sandbox: sb.Name, Reason: "retention"})
		m.cfg.Logger.Info("sweeper removed sandbox past retention", "sandbox", sb.Name, "key", key.Short())
	}
	return nil
}

// sweepable: running and idle past IdleTimeout, or stopped (and unused) past Retention.
func (m *Manager) sweepable(ctx context.Context, key identity.Key, sb *driver.Sandbox) bool {
	now := m.cfg.Now()
	used := m.idleSince(key, sb)
	switch sb.State {
	case driver.StateRunning:
		return now.Sub(used) >= m.cfg.IdleTimeout
	case driver.StateStopped, driver.StateDead:
		since := sb.FinishedAt
		if since.IsZero() { // List does not carry FinishedAt: ask
			if full, err := m.drv.Inspect(ctx, sb.Name); err == nil && full.ID == sb.ID {
				since = full.FinishedAt
			}
		}
		if used.After(since) {
			since = used
		}
		return now.Sub(since) >= m.cfg.Retention
	}
	return false
}

// Sweeper holds a home's sweeper lock: only one process at a time sweeps a home.
type Sweeper struct {
	m    *Manager
	lock *flock.Flock
}

// TrySweeper takes the home's sweeper lock without waiting; ok is false when another process holds it.
func (m *Manager) TrySweeper() (s *Sweeper, ok bool, err error) {
	lock := flock.New(filepath.Join(m.home.Dir, "locks", "sweeper.lock"))
	ok, err = lock.TryLock()
	if err != nil || !ok {
		return nil, false, err
	}
	return &Sweeper{m: m, lock: lock}, true, nil
}

// Release gives the sweeper lock back.
func (s *Sweeper) Release() error { return s.lock.Unlock() }

// RunSweeper sweeps every interval until ctx ends. While another process holds the sweeper lock it only
// retries the lock, so exactly one process sweeps and a survivor takes over when the sweeper exits.
func (m *Manager) RunSweeper(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	var s *Sweeper
	defer func() {
		if s != nil {
			_ = s.Release()
		}
	}()
	for {
		if s == nil {
			var ok bool
			var err error
			if s, ok, err = m.TrySweeper(); err != nil {
				return err
			} else if !ok {
				s = nil
			}
		}
		if s != nil {
			if _, err := m.SweepOnce(ctx); err != nil && ctx.Err() == nil {
				m.cfg.Logger.Warn("sweep failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
