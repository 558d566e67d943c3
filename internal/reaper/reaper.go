// Package reaper removes resources of this installation whose owner is provably gone, and keeps everything
// else. In a fleet one replica at a time reaps (the leader of the store lease "reaper", or of a Kubernetes Lease);
// it runs at boot and on a ticker. Every removal, and every resource kept because something could not be known,
// is an event (rate-limited).
//
// The rule is one pure decision (Decide): a resource is removed only when it carries this installation's labels
// and a key, no live lease holds that key, the store says no run of that key is running, and the resource itself
// is neither paused nor (unless its source says a running one dies with its owner) running. An error looking up
// the lease or the runs, a resource of another installation or without our labels, an active status, a hold its
// source reports (a workspace kept on purpose, a claim its sandbox still uses): each keeps it. A keyed resource is
// removed under its key's lease, taken first (Once), so no replica adopts it mid-removal.
package reaper

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/time/rate"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/store"
)

// Resource is one thing a driver made (a container, a pod, a claim, a network): its kind, name, labels and,
// where it has one, its state.
type Resource struct {
	Kind   string // container, pod, claim, configmap, networkpolicy, network, image, volume
	Name   string
	ID     string
	Labels map[string]string
	State  string // the driver's words: running, paused, exited, created, ...; "" for kinds without one
	// ReapRunning: a running resource dies with its owner (a pod whose agent dials the replica that made it), so
	// "running" does not keep it; it is removed under its key's lease like a stopped one.
	ReapRunning bool
	// Hold, when set, keeps the resource for that reason whatever its key's facts: what only its source knows
	// (ReasonInUse, ReasonWorkspaceKept, ReasonRecent).
	Hold string
	// Grace: removed only once nothing of its key (a run, a lease) was active for this long (a workspace claim:
	// a user's files outlive their replica that long). 0: at once.
	Grace time.Duration
	// Keyless: the resource belongs to no key (a replica's channel policy, a probe's pod); its source proves it
	// abandoned (State not active, no Hold), and no key's lease or runs are asked.
	Keyless bool
}

// Reasons a resource is kept or removed (the events' reason field).
const (
	ReasonUnlabelled    = "unlabelled"           // no installation or key label: not ours to judge
	ReasonForeign       = "foreign_installation" // another installation's
	ReasonActive        = "resource_active"      // running or paused
	ReasonLeaseUnknown  = "lease_unknown"        // the key's lease could not be read or taken
	ReasonLeased        = "leased"               // a live lease holds the key: its owner lives
	ReasonStoreUnknown  = "store_unknown"        // the key's runs could not be read
	ReasonRunActive     = "run_active"           // a run of the key is running
	ReasonInUse         = "in_use"               // a claim whose sandbox stands, a channel policy a pod dials
	ReasonWorkspaceKept = "workspace_kept"       // a workspace kept on purpose (a suspend, rm --keep-workspace)
	ReasonRecent        = "recently_used"        // its key (or, keyless, itself) was active within its grace
	ReasonOrphaned      = "orphaned"             // no lease, no running run, not active: removed
)

// Facts is what Decide knows of a resource's key, each with the error of its lookup.
type Facts struct {
	LeaseLive bool
	LeaseErr  error
	RunActive bool
	RunErr    error
	// LastActive is the latest of the key's lease expiry and its newest run's creation and end; zero when it
	// has neither.
	LastActive time.Time
}

// Verdict is Decide's answer.
type Verdict struct {
	Remove bool
	Reason string
	Key    identity.Key // the resource's key, when its labels make one
}

// Decide says whether r, of installation, is removed at now. It does no I/O; keyFacts is asked only once r's
// labels make it ours and nothing it carries keeps it.
func Decide(installation string, r Resource, now time.Time, keyFacts func(identity.Key) Facts) Verdict {
	inst, hasInst := r.Labels[driver.LabelInstallation]
	if r.Keyless {
		switch {
		case hasInst && inst != installation:
			return Verdict{Reason: ReasonForeign}
		case r.Hold != "":
			return Verdict{Reason: r.Hold}
		case active(r):
			return Verdict{Reason: ReasonActive}
		}
		return Verdict{Remove: true, Reason: ReasonOrphaned}
	}
	key, keyErr := identity.New(r.Labels[driver.LabelTenant], r.Labels[driver.LabelUser])
	switch {
	case !hasInst || inst == "":
		return Verdict{Reason: ReasonUnlabelled}
	case inst != installation:
		return Verdict{Reason: ReasonForeign}
	case keyErr != nil || key.Hex() != r.Labels[driver.LabelKey]:
		return Verdict{Reason: ReasonUnlabelled}
	case r.Hold != "":
		return Verdict{Reason: r.Hold, Key: key}
	case active(r):
		return Verdict{Reason: ReasonActive, Key: key}
	}
	f := keyFacts(key)
	switch {
	case f.LeaseErr != nil:
		return Verdict{Reason: ReasonLeaseUnknown, Key: key}
	case f.LeaseLive:
		return Verdict{Reason: ReasonLeased, Key: key}
	case f.RunErr != nil:
		return Verdict{Reason: ReasonStoreUnknown, Key: key}
	case f.RunActive:
		return Verdict{Reason: ReasonRunActive, Key: key}
	case r.Grace > 0 && now.Sub(f.LastActive) < r.Grace:
		return Verdict{Reason: ReasonRecent, Key: key}
	}
	return Verdict{Remove: true, Reason: ReasonOrphaned, Key: key}
}

// active: paused or restarting always; running unless the source says a running one dies with its owner.
func active(r Resource) bool {
	return r.State == "paused" || r.State == "restarting" || (r.State == "running" && !r.ReapRunning)
}

// unknown reports whether a keep was for something that could not be known (an event says so).
func unknown(reason string) bool {
	return reason == ReasonLeaseUnknown || reason == ReasonStoreUnknown
}

// Source lists and removes one driver's resources.
type Source interface {
	// List returns the resources that carry any installation's label (and the keyless ones it judges).
	List(ctx context.Context) ([]Resource, error)
	// Remove deletes r; one already gone is not an error.
	Remove(ctx context.Context, r Resource) error
}

// Store is what the reaper reads and writes of the store.
type Store interface {
	GetLease(ctx context.Context, name string) (store.Lease, error)
	AcquireLease(ctx context.Context, name, owner, address string, ttl time.Duration) (store.Lease, error)
	ReleaseLease(ctx context.Context, l store.Lease) error
	ListRuns(ctx context.Context, f store.RunFilter) ([]store.Run, error)
	AppendEvent(ctx context.Context, e store.Event) (int64, error)
}

// LeaseName is the store lease of key (the fleet's: internal/fleet.LeaseName).
func LeaseName(key identity.Key) string { return "key/" + key.Hex() }

// Config is what a Reaper needs.
type Config struct {
	Installation string
	Source       Source
	Store        Store
	Logger       *slog.Logger // nil discards
	// EventsPerSecond bounds the kept-on-unknown events (removals are always recorded); default 1, burst 20.
	EventsPerSecond float64
	// Owner names the reaper in the key leases it takes while it removes (a fleet replica's id); default a
	// random "reaper-..." id.
	Owner string
	// KeyLeaseTTL bounds how long a key lease taken for a removal is held if the reaper dies holding it; default
	// 30s. It is released as soon as the key's resources are removed.
	KeyLeaseTTL time.Duration
	// Now is the clock of the graces; default time.Now.
	Now func() time.Time
}

// Reaper makes passes over a Source.
type Reaper struct {
	cfg   Config
	limit *rate.Limiter
}

// New returns a Reaper.
func New(cfg Config) *Reaper {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.EventsPerSecond <= 0 {
		cfg.EventsPerSecond = 1
	}
	if cfg.Owner == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		cfg.Owner = "reaper-" + hex.EncodeToString(b[:])
	}
	if cfg.KeyLeaseTTL <= 0 {
		cfg.KeyLeaseTTL = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Reaper{cfg: cfg, limit: rate.NewLimiter(rate.Limit(cfg.EventsPerSecond), 20)}
}

// Report says what one pass did, by resource name.
type Report struct {
	Removed []string
	Kept    map[string]string // name -> reason, as the pass's last round decided
}

// maxRounds bounds the rounds of a pass: a removal can free what depended on it (a claim once its sandbox is
// gone, a channel policy once no pod dials it), which the next round's listing sees.
const maxRounds = 4

// Once makes one pass: every listed resource decided, the orphans removed, in rounds until one removes nothing.
func (r *Reaper) Once(ctx context.Context) (Report, error) {
	rep := Report{Kept: map[string]string{}}
	var errs []error
	for range maxRounds {
		n, err := r.round(ctx, &rep)
		if err != nil {
			errs = append(errs, err)
		}
		if n == 0 || ctx.Err() != nil {
			break
		}
	}
	return rep, errors.Join(errs...)
}

// round decides and removes once over a fresh listing; it returns how many it removed.
func (r *Reaper) round(ctx context.Context, rep *Report) (int, error) {
	rs, err := r.cfg.Source.List(ctx)
	if err != nil {
		return 0, fmt.Errorf("reap: list: %w", err)
	}
	clear(rep.Kept)
	facts := map[identity.Key]Facts{} // asked once per key per round
	removed := 0
	var errs []error
	for _, res := range rs {
		if ctx.Err() != nil { // stopping (the lead lost, shutdown): what is left is not judged on failed lookups
			break
		}
		v := Decide(r.cfg.Installation, res, r.cfg.Now(), func(k identity.Key) Facts {
			f, ok := facts[k]
			if !ok {
				f = r.facts(ctx, k)
				facts[k] = f
			}
			return f
		})
		if v.Remove && !res.Keyless {
			v = r.removeLeased(ctx, res, v, &errs)
		} else if v.Remove {
			if err := r.cfg.Source.Remove(ctx, res); err != nil {
				errs = append(errs, fmt.Errorf("reap %s %s: %w", res.Kind, res.Name, err))
				continue
			}
		}
		if !v.Remove {
			rep.Kept[res.Name] = v.Reason
			if unknown(v.Reason) && r.limit.Allow() {
				r.event(ctx, events.NameReaperKept, res, v.Reason)
			}
			continue
		}
		removed++
		rep.Removed = append(rep.Removed, res.Name)
		r.event(ctx, events.NameReaperRemoved, res, v.Reason)
	}
	return removed, errors.Join(errs...)
}

// removeLeased removes res under its key's lease: taken first, so that no replica claims the key (and adopts
// what is being removed) meanwhile, and released after. A lease another holds keeps res (its owner lives); one
// that cannot be taken keeps it as unknown. A failed removal keeps it too (the error is returned through errs).
func (r *Reaper) removeLeased(ctx context.Context, res Resource, v Verdict, errs *[]error) Verdict {
	l, err := r.cfg.Store.AcquireLease(ctx, LeaseName(v.Key), r.cfg.Owner, "", r.cfg.KeyLeaseTTL)
	switch {
	case errors.Is(err, store.ErrLeaseHeld):
		return Verdict{Reason: ReasonLeased, Key: v.Key}
	case err != nil:
		return Verdict{Reason: ReasonLeaseUnknown, Key: v.Key}
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := r.cfg.Store.ReleaseLease(rctx, l); err != nil {
			r.cfg.Logger.Warn("reaper: release key lease", "lease", l.Name, "err", err)
		}
	}()
	if err := r.cfg.Source.Remove(ctx, res); err != nil {
		*errs = append(*errs, fmt.Errorf("reap %s %s: %w", res.Kind, res.Name, err))
		return Verdict{Reason: ReasonActive, Key: v.Key}
	}
	return v
}

func (r *Reaper) facts(ctx context.Context, key identity.Key) Facts {
	var f Facts
	l, err := r.cfg.Store.GetLease(ctx, LeaseName(key))
	switch {
	case err == nil:
		f.LeaseLive = l.Live
		f.LastActive = l.Expires
	case !isNotFound(err):
		f.LeaseErr = err
	}
	runs, err := r.cfg.Store.ListRuns(ctx, store.RunFilter{Tenant: key.Tenant, User: key.User, Status: store.StatusRunning, Limit: 1})
	f.RunErr, f.RunActive = err, len(runs) > 0
	if err == nil && !f.RunActive {
		last, err := r.cfg.Store.ListRuns(ctx, store.RunFilter{Tenant: key.Tenant, User: key.User, Limit: 1})
		f.RunErr = err
		for _, run := range last {
			f.LastActive = latest(f.LastActive, run.CreatedAt, run.FinishedAt)
		}
	}
	return f
}

func latest(ts ...time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if t.After(out) {
			out = t
		}
	}
	return out
}

func (r *Reaper) event(ctx context.Context, name string, res Resource, reason string) {
	e, err := events.New("", name, events.ReaperDecision{Kind: res.Kind, Resource: res.Name, Reason: reason})
	if err == nil {
		_, err = r.cfg.Store.AppendEvent(ctx, e)
	}
	if err != nil {
		r.cfg.Logger.Warn("reaper: record event", "event", name, "resource", res.Name, "err", err)
	}
}

// LeaderStore is the lease part of the store the election uses.
type LeaderStore interface {
	AcquireLease(ctx context.Context, name, owner, address string, ttl time.Duration) (store.Lease, error)
	RenewLeases(ctx context.Context, owner string, held []store.Lease, ttl time.Duration) ([]store.Lease, error)
	ReleaseLease(ctx context.Context, l store.Lease) error
}

// LeaderLease is the store lease of the reaping replica.
const LeaderLease = "reaper"

// RunLeader makes a pass at once and then every interval while this replica (owner) leads: it holds the store
// lease LeaderLease, taken when free and renewed every ttl/3. A replica that does not lead tries again every
// ttl/3. It returns when ctx ends, releasing the lease.
func (r *Reaper) RunLeader(ctx context.Context, st LeaderStore, owner string, ttl, interval time.Duration) {
	var (
		held    *store.Lease
		lastRun time.Time
	)
	tick := time.NewTicker(ttl / 3)
	defer tick.Stop()
	defer func() {
		if held != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = st.ReleaseLease(rctx, *held)
		}
	}()
	for {
		if held == nil {
			if l, err := st.AcquireLease(ctx, LeaderLease, owner, "", ttl); err == nil {
				held = &l
				r.cfg.Logger.Info("reaper: leading", "owner", owner, "token", l.Token)
			}
		} else {
			renewed, err := st.RenewLeases(ctx, owner, []store.Lease{*held}, ttl)
			if err == nil && len(renewed) == 0 {
				r.cfg.Logger.Warn("reaper: lost the lead", "owner", owner)
				held = nil
			} else if err == nil {
				held = &renewed[0]
			}
		}
		if held != nil && time.Since(lastRun) >= interval {
			lastRun = time.Now()
			if rep, err := r.Once(ctx); err != nil && ctx.Err() == nil {
				r.cfg.Logger.Warn("reaper: pass", "err", err, "removed", len(rep.Removed))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// RunPasses makes a pass at once and then every interval until ctx ends, for a caller that leads by other means
// (a Kubernetes Lease through client-go's leader election: ctx ends when the lead is lost).
func (r *Reaper) RunPasses(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		if rep, err := r.Once(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("reaper: pass", "err", err, "removed", len(rep.Removed))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
