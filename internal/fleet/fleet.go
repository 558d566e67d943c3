// Package fleet runs several `sandkeep serve` replicas over one store and one driver: a key belongs to one
// replica at a time through a lease in the store (store.LeaseStore: owner, fencing token, expiry by the store's
// clock, renewed while the owner lives). The owner holds the key's channel, egress proxy and gate; another
// replica forwards the key's requests to it over an internal, authenticated address (Forwarder, Handler), or
// takes the lease over once it has expired. A stale owner is fenced: the run and event writes it makes after
// losing the lease are refused by the store (FencedStore).
package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/store"
)

// DefaultTTL is a key lease's lifetime when Config.TTL is zero: a dead owner's keys are taken over this long
// after its last renewal at worst. Renewal runs every TTL/3.
const DefaultTTL = 10 * time.Second

// LeaseName is the lease of key.
func LeaseName(key identity.Key) string { return "key/" + key.Hex() }

// NewReplicaID returns an owner id unique to this process's lifetime: the host name and 8 random bytes. A
// restarted replica is a new owner, so it never mistakes its predecessor's leases for its own.
func NewReplicaID() string {
	host, _ := os.Hostname()
	var b [8]byte
	_, _ = rand.Read(b[:])
	if host == "" {
		host = "replica"
	}
	return host + "-" + hex.EncodeToString(b[:])
}

// Config is what a Replica needs. Leases, ID and Address are required.
type Config struct {
	Leases  store.LeaseStore
	ID      string        // this replica's owner id (NewReplicaID)
	Address string        // where other replicas reach this one's Handler (host:port)
	TTL     time.Duration // a lease's lifetime; 0 means DefaultTTL
	Logger  *slog.Logger  // nil discards
	Now     func() time.Time
}

// Replica is this process's side of the leases: the keys it holds, renewed in one write every TTL/3 while Run
// runs. It is safe for concurrent use.
type Replica struct {
	cfg Config

	mu     sync.Mutex
	held   map[string]heldLease // by lease name
	others map[string]heldLease // leases other replicas hold, as last read, until a third of a TTL passed; bounded by maxOthers
	stop   bool                 // draining: take no new key
}

// heldLease is a lease this replica holds and until when it may act on it: by its own clock, from just before
// the write that acquired or renewed it, so it stops acting no later than the store expires it.
type heldLease struct {
	l     store.Lease
	until time.Time
}

// Owner says who serves a key: this replica (Self, with the lease it holds) or another (Lease names it and its
// Address).
type Owner struct {
	Self  bool
	Lease store.Lease
}

// New returns a Replica holding nothing.
func New(cfg Config) (*Replica, error) {
	if cfg.Leases == nil || cfg.ID == "" || cfg.Address == "" {
		return nil, errors.New("fleet: Leases, ID and Address are required")
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Replica{cfg: cfg, held: map[string]heldLease{}, others: map[string]heldLease{}}, nil
}

// ID is this replica's owner id.
func (r *Replica) ID() string { return r.cfg.ID }

// TTL is the lifetime of the leases this replica takes.
func (r *Replica) TTL() time.Duration { return r.cfg.TTL }

// Claim says who serves key: this replica when it holds the key's lease or can take it (free, expired,
// released), another when that one holds it live. A draining replica takes no new key (ErrDraining).
func (r *Replica) Claim(ctx context.Context, key identity.Key) (Owner, error) {
	name := LeaseName(key)
	now := r.cfg.Now()
	r.mu.Lock()
	h, ok := r.held[name]
	stopping := r.stop
	r.mu.Unlock()
	if ok && now.Before(h.until) {
		return Owner{Self: true, Lease: h.l}, nil
	}
	// Another replica's, read less than a third of a TTL ago: forwarded there without a store round trip. A
	// forward that finds it gone forgets it (Forget), so the next claim reads the store again.
	r.mu.Lock()
	oh, other := r.others[name]
	r.mu.Unlock()
	if other && now.Before(oh.until) {
		return Owner{Lease: oh.l}, nil
	}
	if stopping {
		return Owner{}, ErrDraining
	}
	l, err := r.cfg.Leases.AcquireLease(ctx, name, r.cfg.ID, r.cfg.Address, r.cfg.TTL)
	if errors.Is(err, store.ErrLeaseHeld) {
		r.mu.Lock()
		if len(r.others) >= maxOthers {
			clear(r.others)
		}
		r.others[name] = heldLease{l: l, until: now.Add(r.cfg.TTL / 3)}
		r.mu.Unlock()
		return Owner{Lease: l}, nil
	}
	if err != nil {
		return Owner{}, fmt.Errorf("claim %s: %w", key, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur, ok := r.held[name]; ok && cur.l.Token > l.Token {
		return Owner{Self: true, Lease: cur.l}, nil // a concurrent claim got a newer one
	}
	if ok && h.l.Token != l.Token {
		r.cfg.Logger.Info("fleet: key lease taken again", "lease", name, "old_token", h.l.Token, "token", l.Token)
	}
	r.held[name] = heldLease{l: l, until: now.Add(r.cfg.TTL)}
	return Owner{Self: true, Lease: l}, nil
}

// Hold takes lease name for this replica, renewed with its keys' leases and handed over with them: a name
// that addresses something of this replica's other than a key (AliasE2B: an E2B sandbox, whose record lives with
// the replica that made it), so that another replica can hand requests about it over (Proxy.ForwardHeld). Held
// live by another replica: store.ErrLeaseHeld.
func (r *Replica) Hold(ctx context.Context, name string) error {
	now := r.cfg.Now()
	l, err := r.cfg.Leases.AcquireLease(ctx, name, r.cfg.ID, r.cfg.Address, r.cfg.TTL)
	if err != nil {
		return fmt.Errorf("hold %s: %w", name, err)
	}
	r.mu.Lock()
	r.held[name] = heldLease{l: l, until: now.Add(r.cfg.TTL)}
	r.mu.Unlock()
	return nil
}

// Unhold releases lease name, when this replica holds it.
func (r *Replica) Unhold(ctx context.Context, name string) error {
	r.mu.Lock()
	h, ok := r.held[name]
	delete(r.held, name)
	r.mu.Unlock()
	if !ok {
		return nil
	}
	return r.cfg.Leases.ReleaseLease(ctx, h.l)
}

// AliasE2B is the lease name an E2B sandbox's replica holds it under (Hold).
func AliasE2B(id string) string { return "e2b/" + id }

// maxOthers bounds the cache of other replicas' leases.
const maxOthers = 65536

// Forget drops what this replica remembers of another's lease of key, after a forward to it failed.
func (r *Replica) Forget(key identity.Key) {
	r.mu.Lock()
	delete(r.others, LeaseName(key))
	r.mu.Unlock()
}

// Fence returns the fence of key's lease while this replica holds it.
func (r *Replica) Fence(key identity.Key) (store.Fence, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.held[LeaseName(key)]
	if !ok || !r.cfg.Now().Before(h.until) {
		return store.Fence{}, false
	}
	return store.FenceOf(h.l), true
}

// Held returns the leases this replica holds, sorted by nothing in particular.
func (r *Replica) Held() []store.Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]store.Lease, 0, len(r.held))
	for _, h := range r.held {
		out = append(out, h.l)
	}
	return out
}

// Run renews every held lease every TTL/3 until ctx ends. A lease the store did not renew is lost: it is
// dropped, and the key's next request claims it again (or goes to its new owner).
func (r *Replica) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.TTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := r.Renew(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("fleet: lease renewal failed", "err", err)
		}
	}
}

// Renew renews every held lease once, in one write.
func (r *Replica) Renew(ctx context.Context) error {
	held := r.Held()
	if len(held) == 0 {
		return nil
	}
	start := r.cfg.Now()
	renewed, err := r.cfg.Leases.RenewLeases(ctx, r.cfg.ID, held, r.cfg.TTL)
	if err != nil {
		return err // keep them: until says how long they may still be acted on
	}
	kept := make(map[string]bool, len(renewed))
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range renewed {
		kept[l.Name] = true
		if h, ok := r.held[l.Name]; ok && h.l.Token == l.Token {
			r.held[l.Name] = heldLease{l: l, until: start.Add(r.cfg.TTL)}
		}
	}
	for _, l := range held {
		if h, ok := r.held[l.Name]; ok && !kept[l.Name] && h.l.Token == l.Token {
			r.cfg.Logger.Warn("fleet: key lease lost", "lease", l.Name, "token", l.Token)
			delete(r.held, l.Name)
		}
	}
	return nil
}

// Drain makes the replica take no new key; the keys it holds stay its own until Release.
func (r *Replica) Drain() {
	r.mu.Lock()
	r.stop = true
	r.mu.Unlock()
}

// Draining reports whether Drain was called.
func (r *Replica) Draining() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stop
}

// Release hands every held lease over: each expires now, so another replica takes the key at its next request.
func (r *Replica) Release(ctx context.Context) error {
	r.mu.Lock()
	held := r.held
	r.held = map[string]heldLease{}
	r.mu.Unlock()
	var errs []error
	for _, h := range held {
		if err := r.cfg.Leases.ReleaseLease(ctx, h.l); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
