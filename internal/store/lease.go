package store

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
)

// Lease is one owner's claim on a name until Expires: in a fleet, the replica that holds a key (its channel,
// proxy and gate), or the one replica that runs the reaper. Expiry is measured by the store's clock (the database
// server's for PostgreSQL), never by the replicas', so replicas whose clocks disagree still agree on who holds it.
type Lease struct {
	Name    string `json:"name"`    // what is leased: "key/<hex>", "reaper"
	Owner   string `json:"owner"`   // the replica that holds it: unique per process lifetime
	Address string `json:"address"` // where the owner takes forwarded requests; may be empty
	// Token is the fencing token: it increases every time the lease is acquired anew (by another owner, or by
	// the same owner after it expired or was released) and stays the same while it is renewed. A write made
	// under a Fence is refused once the lease has another token.
	Token   int64     `json:"token"`
	Expires time.Time `json:"expires"`
	Live    bool      `json:"live"` // the lease had not expired when it was read (by the store's clock)
}

// Fence is what a write made by a lease's owner carries: the lease and the token it held. The store commits the
// write only while that lease is live with that token, in the same transaction, and refuses it with
// ErrLeaseLost otherwise: an owner that lost its lease (expired, taken over) cannot write after it.
type Fence struct {
	Lease string
	Token int64
}

// FenceOf is the fence of lease l.
func FenceOf(l Lease) Fence { return Fence{Lease: l.Name, Token: l.Token} }

// LeaseStore keeps leases. Implemented by every Store (sqlite, postgres); storetest checks it.
type LeaseStore interface {
	// AcquireLease takes lease name for owner until ttl from now: when nobody holds it, when its holder's lease
	// has expired or was released (a takeover: a new token), or when owner holds it already (a renewal: the
	// same token; address is updated). When another owner holds it live, it returns that holder's lease and an
	// error that is ErrLeaseHeld (errdefs.ErrConflict).
	AcquireLease(ctx context.Context, name, owner, address string, ttl time.Duration) (Lease, error)
	// RenewLeases extends each of held (leases of owner) until ttl from now, in one write, and returns those it
	// renewed. A lease missing from the answer is lost: it expired or has another token, and stays as it is.
	RenewLeases(ctx context.Context, owner string, held []Lease, ttl time.Duration) ([]Lease, error)
	// ReleaseLease gives l up at once (it expires now) while l.Owner still holds it with l.Token; releasing a
	// lease that is already lost is not an error.
	ReleaseLease(ctx context.Context, l Lease) error
	// GetLease returns lease name as stored, live or not (Live says), or ErrNotFound when it never existed.
	GetLease(ctx context.Context, name string) (Lease, error)
	// ListLeases returns the live leases whose names begin with prefix, sorted by name.
	ListLeases(ctx context.Context, prefix string) ([]Lease, error)
}

// ErrLeaseHeld is in AcquireLease's error when another owner holds the lease; it is an errdefs.ErrConflict.
var ErrLeaseHeld = fmt.Errorf("lease held by another owner: %w", errdefs.ErrConflict)

// ErrLeaseLost is in the error of a write under a fence that no longer holds; it is an
// errdefs.ErrFailedPrecondition.
var ErrLeaseLost = fmt.Errorf("lease lost: %w", errdefs.ErrFailedPrecondition)

// MaxLeaseName bounds a lease name.
const MaxLeaseName = 256

// CheckLease validates the arguments of AcquireLease. Implementations call it first.
func CheckLease(name, owner string, ttl time.Duration) error {
	switch {
	case name == "" || len(name) > MaxLeaseName:
		return invalid("acquire lease %q: the name must have 1 to %d bytes", name, MaxLeaseName)
	case owner == "":
		return invalid("acquire lease %s: empty owner", name)
	case ttl < time.Millisecond:
		return invalid("acquire lease %s: ttl %s: want at least 1ms", name, ttl)
	}
	return nil
}

// CheckRenew validates the arguments of RenewLeases.
func CheckRenew(owner string, held []Lease, ttl time.Duration) error {
	if owner == "" {
		return invalid("renew leases: empty owner")
	}
	if ttl < time.Millisecond {
		return invalid("renew leases: ttl %s: want at least 1ms", ttl)
	}
	for _, l := range held {
		if l.Owner != owner {
			return invalid("renew leases: lease %s is %q's, not %q's", l.Name, l.Owner, owner)
		}
	}
	return nil
}

// ErrHeld returns AcquireLease's error for lease name, held by holder.
func ErrHeld(name string, holder Lease) error {
	return fmt.Errorf("acquire lease %s: held by %s until %s: %w", name, holder.Owner,
		holder.Expires.Format(time.RFC3339Nano), ErrLeaseHeld)
}

// ErrFenced returns the error of a write under fence f, which no longer holds.
func ErrFenced(f Fence) error {
	return fmt.Errorf("lease %s with token %d is no longer held: the write is refused: %w", f.Lease, f.Token, ErrLeaseLost)
}

// RunWriter is the run and event writes of a Store, as Store documents them.
type RunWriter interface {
	CreateRun(ctx context.Context, r Run) error
	UpdateRun(ctx context.Context, id string, upd RunUpdate) error
	AppendEvent(ctx context.Context, e Event) (int64, error)
	EnqueueEvent(e Event, done func(seq int64, err error))
	EnqueueUpdate(id string, upd RunUpdate, done func(err error))
}

// Fenced returns g's run and event writes made under f: each is committed only while f holds, checked in the
// transaction that commits it, and otherwise refused with ErrLeaseLost (the writes around it are committed).
func (g *Group) Fenced(f Fence) RunWriter { return fenced{g: g, f: f} }

type fenced struct {
	g *Group
	f Fence
}

func (w fenced) CreateRun(ctx context.Context, r Run) error {
	r, err := PrepareRun(r)
	if err != nil {
		return err
	}
	return w.g.doFenced(ctx, &w.f, func(ctx context.Context, ws Writes) error { return ws.InsertRun(ctx, r) })
}

func (w fenced) UpdateRun(ctx context.Context, id string, upd RunUpdate) error {
	upd, err := PrepareUpdate(id, upd)
	if err != nil {
		return err
	}
	return w.g.doFenced(ctx, &w.f, func(ctx context.Context, ws Writes) error { return ws.FinishRun(ctx, id, upd) })
}

func (w fenced) AppendEvent(ctx context.Context, e Event) (int64, error) {
	e, err := PrepareEvent(e)
	if err != nil {
		return 0, err
	}
	var seq int64
	err = w.g.doFenced(ctx, &w.f, func(ctx context.Context, ws Writes) error {
		var err error
		seq, err = ws.InsertEvent(ctx, e)
		return err
	})
	return seq, err
}

func (w fenced) EnqueueEvent(e Event, done func(seq int64, err error)) {
	e, err := PrepareEvent(e)
	if err != nil {
		if done != nil {
			done(0, err)
		}
		return
	}
	var seq int64
	w.g.enqueue(&op{
		fence: &w.f,
		apply: func(ctx context.Context, ws Writes) error {
			var err error
			seq, err = ws.InsertEvent(ctx, e)
			return err
		},
		done: func(err error) {
			if done != nil {
				done(seq, err)
			}
		},
	})
}

func (w fenced) EnqueueUpdate(id string, upd RunUpdate, done func(err error)) {
	upd, err := PrepareUpdate(id, upd)
	if err != nil {
		if done != nil {
			done(err)
		}
		return
	}
	w.g.enqueue(&op{
		fence: &w.f,
		last:  true,
		apply: func(ctx context.Context, ws Writes) error { return ws.FinishRun(ctx, id, upd) },
		done: func(err error) {
			if done != nil {
				done(err)
			}
		},
	})
}

// ErrLeaseNotFound returns the error for a lease that never existed.
func ErrLeaseNotFound(name string) error {
	return fmt.Errorf("get lease %s: %w", name, errdefs.ErrNotFound)
}
