package lifecycle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/gofrs/flock"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// A warm pool keeps sandboxes of one operator template made ahead: created, started, hardened and with their
// agents connected, holding nothing of anyone. A new key's first command claims one (the "claim" row of ensure)
// instead of creating a sandbox: the member is taken from its pool under the pool's lock (one process per home
// keeps the pools, so a member is taken once), and a claim record (claims.go), written under the key's gate (a
// flock every process of the home takes), makes it the key's: the key's sandbox, files and uid are the member's
// from then on. Nothing the member's container was created with names the key, so nothing is recreated, and
// nothing of the engine is asked either: the container keeps the member's name (lookups by key go through the
// record, inspectKey). An engine rename was the claim's step once; Docker renames running containers one at a
// time, so 50 claims at once queued ~8 ms each behind each other (docs/BENCHMARKS.md).
//
// One process per state home keeps the pools (pool.lock): the daemon or `serve`. It refills in the background as
// soon as a member is claimed, never past the operator's cap on members in all; an empty pool leaves a new key to
// the usual create. On start it settles claims an older version left half-done, adopts the members it finds
// unclaimed as nobody's, and drains those whose template changed (posture or image) or is no longer pooled.

// PoolSpec is one template's warm pool: Size members of Shape (whose Template names the pool).
type PoolSpec struct {
	Shape *Shape
	Size  int
}

// refillParallel bounds the members made at once: each create and start keeps the engine busy, and a claim that
// runs meanwhile should not wait behind many of them.
const refillParallel = 4

// refillRetry is how long a pool waits after a member could not be made before it tries again; each failure in a
// row doubles the wait, up to refillBackoffMax, so a pool whose image is missing (or whose engine refuses) does
// not pull or create in a loop. A member made resets it.
const (
	refillRetry      = 5 * time.Second
	refillBackoffMax = 5 * time.Minute
)

// backoff is the wait after the n-th failure in a row (n >= 1).
func backoff(n int) time.Duration {
	d := refillRetry
	for i := 1; i < n && d < refillBackoffMax; i++ {
		d *= 2
	}
	return min(d, refillBackoffMax)
}

// pools is the Manager's set of warm pools.
type pools struct {
	lock   *flock.Flock
	cancel context.CancelFunc
	wg     sync.WaitGroup // the refill loop and every member being made or drained
	wake   chan struct{}  // room for one: a claim or a change asks the loop to look again
	sem    chan struct{}  // refillParallel slots
	// claiming counts claims in flight: a refill waits for a burst of claims to end, since it would compete with
	// them for the engine (their renames) and the CPU; the last claim of a burst pokes it.
	claiming atomic.Int32

	mu     sync.Mutex       // guards what follows
	cap    int              // members in all, ready or being made
	byTpl  map[string]*pool // by template name
	making int              // members being made, all pools
}

// pool is one template's members.
type pool struct {
	spec      PoolSpec
	ready     []*member // created, started, connected; nobody's
	making    int
	failures  int       // rounds in a row in which a member could not be made
	notBefore time.Time // no member is made before this (Config.Now), after a failure
}

// member is one pool sandbox.
type member struct {
	key   identity.Key
	sb    *driver.Sandbox
	owner atomic.Pointer[identity.Key] // the key that claimed it; nil until then (its channel's verifier reads it)
}

func (mb *member) current() identity.Key {
	if k := mb.owner.Load(); k != nil {
		return *k
	}
	return mb.key
}

// PoolStatus is what one template's pool holds now.
type PoolStatus struct {
	Template string
	Size     int // the operator's N
	Ready    int
	Making   int
}

// inspectKey looks key's sandbox up: an unclaimed member's by its name; a key's by the name of the member it
// claimed (its claim record says which), else by its own (a claimed key's sandbox recreated since, or a claim
// an older version made by renaming the member).
//
// On a driver that keeps the claims (claims.go), the engine is asked which member key claimed when the home has
// no record of it (another replica claimed it, or this process was killed before writing its record), and a
// record the engine contradicts (the member is another key's, or nobody's) is dropped.
func (m *Manager) inspectKey(ctx context.Context, key identity.Key) (*driver.Sandbox, error) {
	if key.Tenant == "" {
		return m.drv.Inspect(ctx, key.MemberName())
	}
	ck, shared := m.claimKeeper()
	if mk := m.home.phys(key); mk != key {
		sb, err := m.drv.Inspect(ctx, mk.MemberName())
		if err == nil && sb.Labels[driver.LabelKey] == mk.Hex() && (!shared || claimedInEngine(sb, key)) {
			return sb, nil
		}
		if err != nil && !cerrdefs.IsNotFound(err) {
			return nil, err
		}
		if shared && err == nil {
			m.home.dropClaim(key) // the member is another's, or nobody's: a claim undone elsewhere
		}
		if shared && err != nil { // the member's record is gone (being recreated: create keeps its name)
			return m.drv.Inspect(ctx, key.ContainerName())
		}
	}
	if shared {
		sb, err := ck.Claimed(ctx, m.home.Installation, key.Hex())
		if err == nil {
			m.noteClaim(key, sb)
			return sb, nil
		}
		if !cerrdefs.IsNotFound(err) {
			return nil, err
		}
	}
	return m.drv.Inspect(ctx, key.ContainerName())
}

// StartPools keeps the warm pools specs ask for, never more than limit members in all (0: the sum of the
// sizes). Called again, it replaces the specs: members of templates no longer pooled, or whose shape or image
// changed, are drained. It returns false, and keeps no pool, when another process of the home keeps them.
func (m *Manager) StartPools(ctx context.Context, specs []PoolSpec, limit int) (bool, error) {
	if !m.drv.Capabilities().Pools {
		return false, fault.New(fault.InvalidArgument, "remove pool from the templates, or use the docker driver",
			"the %s driver cannot keep warm pools", m.drv.Name())
	}
	sum := 0
	seen := map[string]bool{}
	for _, s := range specs {
		if s.Shape == nil || s.Shape.Template == "" || s.Size < 0 {
			return false, fault.New(fault.InvalidArgument, "give each pool a template and a size of 0 or more",
				"a warm pool needs a template and a size")
		}
		if seen[s.Shape.Template] {
			return false, fault.New(fault.InvalidArgument, "name each template once", "template %q is pooled twice", s.Shape.Template)
		}
		if len(s.Shape.cfg.Companions) > 0 {
			return false, fault.New(fault.InvalidArgument, "remove pool from the template",
				"template %q has companion services, which a pool cannot make ahead", s.Shape.Template)
		}
		seen[s.Shape.Template] = true
		sum += s.Size
	}
	if limit <= 0 {
		limit = sum
	}
	m.mu.Lock()
	p := m.pools
	m.mu.Unlock()
	if p == nil {
		lock := flock.New(filepath.Join(m.home.Dir, "pool.lock"))
		ok, err := lock.TryLock()
		if err != nil {
			return false, fmt.Errorf("pool lock: %w", err)
		}
		if !ok {
			return false, nil
		}
		p = &pools{lock: lock, wake: make(chan struct{}, 1), sem: make(chan struct{}, refillParallel),
			byTpl: map[string]*pool{}}
		if err := m.reconcileClaims(ctx); err != nil {
			lock.Unlock()
			return false, err
		}
	}
	p.mu.Lock()
	p.cap = limit
	old := p.byTpl
	p.byTpl = map[string]*pool{}
	for _, s := range specs {
		np := &pool{spec: s}
		if op := old[s.Shape.Template]; op != nil {
			np.ready, np.making = op.ready, op.making
		}
		p.byTpl[s.Shape.Template] = np
	}
	var drop []*member
	for tpl, op := range old {
		if p.byTpl[tpl] == nil {
			drop = append(drop, op.ready...)
		}
	}
	p.mu.Unlock()
	first := false
	m.mu.Lock()
	if m.pools == nil {
		m.pools, first = p, true
	}
	m.mu.Unlock()
	if first {
		if err := m.adoptMembers(ctx, p); err != nil {
			return false, err
		}
		lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		p.cancel = cancel
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			m.refillLoop(lctx, p)
		}()
	}
	for _, mb := range drop {
		m.drainMember(ctx, p, mb)
	}
	m.drainStale(ctx, p)
	p.poke()
	return true, nil
}

// Pools reports each pool's members, sorted by template; nil when this process keeps none.
func (m *Manager) Pools() []PoolStatus {
	p := m.poolSet()
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []PoolStatus
	for tpl, pl := range p.byTpl {
		out = append(out, PoolStatus{Template: tpl, Size: pl.spec.Size, Ready: len(pl.ready), Making: pl.making})
	}
	slices.SortFunc(out, func(a, b PoolStatus) int {
		if a.Template < b.Template {
			return -1
		}
		if a.Template > b.Template {
			return 1
		}
		return 0
	})
	return out
}

func (m *Manager) poolSet() *pools {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pools
}

// stopPools ends the refill loop and waits for the members being made; members stay (the next process adopts
// them).
func (m *Manager) stopPools() {
	m.mu.Lock()
	p := m.pools
	m.pools = nil
	m.mu.Unlock()
	if p == nil {
		return
	}
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
	_ = p.lock.Unlock()
}

func (p *pools) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// refillLoop makes members wherever a pool is short, until ctx ends.
func (m *Manager) refillLoop(ctx context.Context, p *pools) {
	retry := time.NewTicker(refillRetry)
	defer retry.Stop()
	for {
		m.refill(ctx, p)
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-retry.C:
		}
	}
}

// refill starts making the members each pool lacks, within the cap; each is made in its own goroutine, at most
// refillParallel at once.
func (m *Manager) refill(ctx context.Context, p *pools) {
	if p.claiming.Load() > 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	total := p.making
	for _, pl := range p.byTpl {
		total += len(pl.ready)
	}
	tpls := make([]string, 0, len(p.byTpl))
	for tpl := range p.byTpl {
		tpls = append(tpls, tpl)
	}
	slices.Sort(tpls)
	now := m.cfg.Now()
	for _, tpl := range tpls {
		pl := p.byTpl[tpl]
		if now.Before(pl.notBefore) {
			continue // backing off after a failure
		}
		for len(pl.ready)+pl.making < pl.spec.Size && total < p.cap && ctx.Err() == nil {
			pl.making++
			p.making++
			total++
			sh := pl.spec.Shape
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				mb, err := m.makeMember(ctx, p, sh)
				p.mu.Lock()
				if cur := p.byTpl[sh.Template]; cur != nil {
					cur.making--
				}
				p.making--
				cur := p.byTpl[sh.Template]
				keep := err == nil && cur != nil && cur.spec.Shape == sh
				if keep {
					cur.ready = append(cur.ready, mb)
				}
				var wait time.Duration
				fails := 0
				switch now := m.cfg.Now(); {
				case cur == nil || cur.spec.Shape != sh:
				case err == nil:
					cur.failures, cur.notBefore = 0, time.Time{}
				case !now.Before(cur.notBefore): // the round's first failure: the others of the round are the same one
					cur.failures++
					fails, wait = cur.failures, backoff(cur.failures)
					cur.notBefore = now.Add(wait)
				}
				p.mu.Unlock()
				switch {
				case err != nil:
					if ctx.Err() == nil && wait > 0 {
						m.cfg.Logger.Warn("warm pool: a member could not be made", "template", sh.Template, "err", err,
							"failures", fails, "retry_in", wait)
					}
				case !keep: // the template changed or left while it was being made
					m.drainMember(ctx, p, mb)
				}
			}()
		}
	}
}

// makeMember creates, starts and connects one member of shape sh.
func (m *Manager) makeMember(ctx context.Context, p *pools, sh *Shape) (*member, error) {
	select {
	case p.sem <- struct{}{}:
		defer func() { <-p.sem }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var raw [8]byte
	_, _ = rand.Read(raw[:])
	mb := &member{key: identity.Member(sh.Template, hex.EncodeToString(raw[:]))}
	cctx, cancel := context.WithTimeout(ctx, m.cfg.SetupTimeout)
	defer cancel()
	imageID, err := m.images.resolve(cctx, sh.cfg.Image)
	if err != nil {
		return nil, err
	}
	want, hash, err := m.postureOf(mb.key, sh)
	if err != nil {
		return nil, err
	}
	undo := func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		m.removeMemberFiles(uctx, sh, mb)
	}
	if dir := m.channelDir(mb.key); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("channel dir: %w", err)
		}
	}
	l, _ := m.listenerWith(mb.key, m.verifier(mb.current))
	spec := m.createSpec(mb.key, sh, want, hash, imageID)
	spec.Name = mb.key.MemberName()
	spec.Labels[driver.LabelPool] = sh.Template
	sb, err := m.createFrom(cctx, mb.key, sh, spec)
	if err != nil {
		undo()
		return nil, err
	}
	running, err := m.drv.Inspect(cctx, sb.Name)
	if err == nil && running.State != driver.StateRunning {
		err = fmt.Errorf("pool member %s is %s right after start: %w", sb.Name, running.State, cerrdefs.ErrUnavailable)
	}
	if err != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_ = m.removeSandbox(uctx, sb)
		cancel()
		undo()
		return nil, err
	}
	mb.sb = running
	m.remember(mb.key, running)
	if l != nil { // connected before it counts as ready: a claim's first command goes straight over the channel
		if _, err := l.Current(cctx, channelWaitForce); err != nil {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			_ = m.removeSandbox(uctx, running)
			cancel()
			undo()
			return nil, fmt.Errorf("pool member %s: its agent did not connect: %w", sb.Name, err)
		}
	}
	return mb, nil
}

// removeMemberFiles removes what a member's key names on the host: its listener, channel directory, workspace
// and volumes, and its cached posture.
func (m *Manager) removeMemberFiles(ctx context.Context, sh *Shape, mb *member) {
	_ = ctx
	m.forget(mb.key)
	m.dropListener(mb.key)
	if err := m.home.RemoveWorkspace(mb.key); err != nil {
		m.cfg.Logger.Warn("warm pool: member workspace not removed", "member", mb.key.MemberName(), "err", err)
	}
	if sh != nil {
		sh.postures.delete(mb.key.Hex())
	}
}

// drainMember removes an unclaimed member and its files, in the background (owned by p.wg).
func (m *Manager) drainMember(ctx context.Context, p *pools, mb *member) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if ck, shared := m.claimKeeper(); shared {
			// Marked drained first, in the engine: a replica that holds it as ready too cannot claim it now, and
			// one that claimed it first keeps it (Conflict: it is that key's, not this pool's any more).
			err := ck.Claim(dctx, mb.sb, driver.Claim{})
			if cerrdefs.IsConflict(err) {
				m.removeMemberFiles(dctx, nil, mb)
				return
			}
			if err != nil && !cerrdefs.IsNotFound(err) {
				m.cfg.Logger.Warn("warm pool: member not drained", "member", mb.sb.Name, "err", err)
				return
			}
		}
		if err := m.removeSandbox(dctx, mb.sb); err != nil {
			m.cfg.Logger.Warn("warm pool: member not removed", "member", mb.sb.Name, "err", err)
			return
		}
		m.removeMemberFiles(dctx, nil, mb)
		m.cfg.Logger.Debug("warm pool: member drained", "member", mb.sb.Name)
	}()
}

// drainStale drains the ready members whose posture or image no longer match their template's shape, and those
// past the pool's size (it was made smaller).
func (m *Manager) drainStale(ctx context.Context, p *pools) {
	p.mu.Lock()
	var stale []*member
	for _, pl := range p.byTpl {
		keep := pl.ready[:0]
		for _, mb := range pl.ready {
			if len(keep) < pl.spec.Size && m.memberFits(ctx, pl.spec.Shape, mb, "") {
				keep = append(keep, mb)
			} else {
				stale = append(stale, mb)
			}
		}
		clear(pl.ready[len(keep):])
		pl.ready = keep
	}
	p.mu.Unlock()
	for _, mb := range stale {
		m.drainMember(ctx, p, mb)
	}
}

// memberFits: mb is what shape sh makes (its posture and image; imageID "" resolves sh's image).
func (m *Manager) memberFits(ctx context.Context, sh *Shape, mb *member, imageID string) bool {
	if mb.sb.Labels[driver.LabelPool] != sh.Template {
		return false
	}
	if imageID == "" {
		id, err := m.images.resolve(ctx, sh.cfg.Image)
		if err != nil {
			return false
		}
		imageID = id
	}
	_, hash, err := m.postureOf(mb.key, sh)
	return err == nil && compatible(mb.sb, imageID, hash)
}

// claim is ensure's claim row: when key is new (no sandbox this process knows of, no claim, no workspace) and
// its shape's template keeps a pool with a ready member of this very posture and image, the member becomes the
// key's. ok false: nothing was claimed and ensure goes on as for any key. The caller holds key's gate.
func (m *Manager) claim(ctx context.Context, key identity.Key, sh *Shape, imageID string) (*driver.Sandbox, bool, error) {
	if sh.Template == "" || key.Tenant == "" || m.cached(key) != nil {
		return nil, false, nil
	}
	p := m.poolSet()
	if p == nil {
		return nil, false, nil
	}
	if rec, ok := m.home.readClaim(key); ok {
		if rec.Done {
			return nil, false, nil
		}
		if done, err := m.reconcileClaim(ctx, key, rec); err != nil || done {
			return nil, false, err
		}
	}
	if _, suspended := m.home.suspendedAt(key); suspended || m.home.HasWorkspace(key) {
		// Not new: a sandbox of its own is only ever created over its workspace (create), and a removal that kept
		// the workspace (or a suspend) kept its files. Asking the engine as well would put a call on every claim's
		// path.
		return nil, false, nil
	}
	if ck, shared := m.claimKeeper(); shared {
		// The home is this replica's alone: the engine says whether another made key's sandbox or workspace, or
		// claimed a member for it. Any doubt leaves the key to the usual path.
		if _, err := m.inspectKey(ctx, key); !cerrdefs.IsNotFound(err) {
			return nil, false, nil
		}
		if exists, err := ck.Exists(ctx, key.ContainerName()); err != nil || exists {
			return nil, false, nil
		}
	}
	p.claiming.Add(1)
	defer func() {
		if p.claiming.Add(-1) == 0 {
			p.poke() // the burst is over: refill now
		}
	}()
	began := time.Now()
	for {
		mb := p.take(sh.Template)
		if mb == nil {
			return nil, false, nil // empty: the usual create, while the refill catches up
		}
		if !m.memberFits(ctx, sh, mb, imageID) {
			m.drainMember(ctx, p, mb) // made for another posture or image: the template changed
			continue
		}
		sb, err := m.takeMember(ctx, key, mb)
		if errors.Is(err, errMemberTaken) {
			continue // another replica claimed it first: it is that key's now
		}
		if err != nil {
			m.cfg.Logger.Warn("warm pool: claim failed", "member", mb.sb.Name, "key", key.Short(), "err", err)
			m.drainMember(ctx, p, mb)
			if ctx.Err() != nil {
				return nil, false, ctx.Err()
			}
			continue
		}
		sh.postures.delete(mb.key.Hex())
		m.emit(ctx, events.NameSandboxClaimed, events.SandboxClaimed{Sandbox: sb.Name, Driver: m.drv.Name(),
			Template: sh.Template, Member: mb.key.MemberName(), DurationMS: time.Since(began).Milliseconds()})
		if err := m.postCreate(ctx, key, sb, sh); err != nil {
			return nil, false, err
		}
		if err := m.postStart(ctx, sb, sh); err != nil {
			return nil, false, err
		}
		return sb, true, nil
	}
}

// mayClaim: key's next ensure may claim a member of sh's pool (this process keeps it, it has a ready member, and
// this process knows no sandbox of key). Its own channel listener would then be made only to be thrown away, a
// bind and a removal per claim under the Manager's lock.
func (m *Manager) mayClaim(key identity.Key, sh *Shape) bool {
	if sh.Template == "" || key.Tenant == "" {
		return false
	}
	p := m.poolSet()
	if p == nil || m.cached(key) != nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pl := p.byTpl[sh.Template]
	return pl != nil && len(pl.ready) > 0
}

// claimHook, when set (tests), is called at each step of a claim: "indexed" (the member's copy of the record
// written, the key's not yet), "recorded" (the key's record written: the claim is made, this process has not
// handed the member's channel and uid over yet).
var claimHook func(step string)

// errMemberTaken: another process claimed (or drained) the member first; it is not this pool's any more.
var errMemberTaken = errors.New("the pool member was claimed by another process first")

// takeMember makes mb key's: the claim record (its one durable step: the key's record is written last, and a
// member copy without it is no claim), then this process's view: the member's uid and channel listener are the
// key's. No engine call: the container keeps the member's name. On a driver that keeps the claims, the engine's
// compare-and-swap on the member's record comes first and is the claim (claims.go); the home's record follows.
func (m *Manager) takeMember(ctx context.Context, key identity.Key, mb *member) (*driver.Sandbox, error) {
	rec := claimRecord{Tenant: key.Tenant, User: key.User, Template: mb.sb.Labels[driver.LabelPool],
		Member: memberIDOf(mb.key.User), Done: true}
	sb := mb.sb.Clone()
	if ck, shared := m.claimKeeper(); shared {
		if claimHook != nil {
			claimHook("taken")
		}
		c := driver.Claim{Key: key.Hex(), Tenant: key.Tenant, User: key.User}
		err := ck.Claim(ctx, mb.sb, c)
		if cerrdefs.IsConflict(err) {
			m.removeMemberFiles(ctx, nil, mb)
			return nil, errMemberTaken
		}
		if err != nil {
			return nil, err
		}
		sb.Labels[driver.LabelClaimedBy], sb.Labels[driver.LabelClaimTenant], sb.Labels[driver.LabelClaimUser] = c.Key, c.Tenant, c.User
		if claimHook != nil {
			claimHook("claimed")
		}
	}
	if err := m.home.writeClaim(key, rec); err != nil {
		m.home.dropClaim(key)
		m.home.dropMemberClaim(mb.key)
		if _, shared := m.claimKeeper(); !shared {
			return nil, err
		}
		m.cfg.Logger.Warn("warm pool: claim record not written (the engine's holds)", "key", key.Short(), "err", err)
	}
	if claimHook != nil {
		claimHook("recorded")
	}
	m.adoptUID(key, mb.key)
	k := key
	mb.owner.Store(&k)
	m.mu.Lock()
	delete(m.known, mb.key.Hex())
	m.known[key.Hex()] = sb
	l := m.listeners[mb.key.Hex()]
	delete(m.listeners, mb.key.Hex())
	own := m.listeners[key.Hex()] // made for the key's own channel directory before the claim: not used
	if l != nil {
		m.listeners[key.Hex()] = l
	} else {
		delete(m.listeners, key.Hex())
	}
	m.mu.Unlock()
	if own != nil && own != l {
		own.Close()
		_ = os.RemoveAll(filepath.Join(m.home.sandboxes(), "chan", key.Short()))
	}
	return sb, nil
}

// adoptUID hands the member's uid, as this process knows it, to key (idOf finds it through the claim record
// otherwise): no write, so a burst of claims does not queue on the uid file's lock.
func (m *Manager) adoptUID(key, member identity.Key) {
	if v, ok := m.uids.load(member.Hex()); ok {
		m.uids.store(key.Hex(), v)
		m.uids.delete(member.Hex())
	}
}

// take removes and returns a ready member of template, or nil.
func (p *pools) take(template string) *member {
	p.mu.Lock()
	defer p.mu.Unlock()
	pl := p.byTpl[template]
	if pl == nil || len(pl.ready) == 0 {
		return nil
	}
	mb := pl.ready[len(pl.ready)-1]
	pl.ready[len(pl.ready)-1] = nil
	pl.ready = pl.ready[:len(pl.ready)-1]
	p.poke() // refill at once
	return mb
}

// reconcileClaim settles a pending record, which only an older version wrote (before renaming the member to the
// key's name): the rename happened (the key's name is the member's container) -> done; it did not -> the record
// goes and the member stays in its pool. done reports the first.
func (m *Manager) reconcileClaim(ctx context.Context, key identity.Key, rec claimRecord) (done bool, err error) {
	sb, err := m.drv.Inspect(ctx, key.ContainerName())
	switch {
	case err == nil && sb.Labels[driver.LabelKey] == rec.member().Hex() &&
		sb.Labels[driver.LabelInstallation] == m.home.Installation:
		rec.Done = true
		if err := m.home.writeClaim(key, rec); err != nil {
			return false, err
		}
		m.cfg.Logger.Info("warm pool: a half-done claim completed", "key", key.Short(), "sandbox", sb.Name)
		return true, nil
	case err == nil || cerrdefs.IsNotFound(err):
		m.home.dropClaim(key)
		m.cfg.Logger.Info("warm pool: a half-done claim undone", "key", key.Short())
		return false, nil
	}
	return false, err
}

// reconcileClaims settles every pending record of the home (at pool start, before members are adopted).
func (m *Manager) reconcileClaims(ctx context.Context) error {
	keys, err := m.home.pendingClaims()
	if err != nil {
		return err
	}
	for _, k := range keys {
		release, err := m.gates.acquire(ctx, k, m.cfg.GateWait)
		if err != nil {
			return err
		}
		if rec, ok := m.home.readClaim(k); ok && !rec.Done {
			_, err = m.reconcileClaim(ctx, k, rec)
		}
		release()
		if err != nil {
			return err
		}
	}
	return nil
}

// adoptMembers takes the unclaimed members an earlier process left into their pools, as nobody's; those of a
// template no longer pooled, or made for another shape or image, are drained.
func (m *Manager) adoptMembers(ctx context.Context, p *pools) error {
	sbs, err := m.drv.List(ctx, m.home.Installation)
	if err != nil {
		return err
	}
	for _, sb := range sbs {
		tpl := sb.Labels[driver.LabelPool]
		if tpl == "" {
			continue
		}
		mk := identity.Member(tpl, memberIDOf(sb.Labels[driver.LabelUser]))
		if mk.Hex() != sb.Labels[driver.LabelKey] || sb.Name != mk.MemberName() {
			continue // renamed to its key's name by an older version's claim, or not a member we made
		}
		mb := &member{key: mk, sb: sb}
		if c, ok := driver.ClaimOf(sb); ok { // claims.go: the engine's record says
			if k, err := identity.New(c.Tenant, c.User); err == nil && k.Hex() == c.Key {
				m.noteClaim(k, sb) // its key's; a claim cut before the home's record gets it now
			} else if c.Key == "" {
				m.drainMember(ctx, p, mb) // a drain cut short: finish it
			}
			continue
		}
		if _, claimed := m.home.claimant(mk); claimed {
			if _, shared := m.claimKeeper(); !shared {
				continue // its key's
			}
			// The home says claimed, the engine not: the home's record outlived a claim undone elsewhere.
		}
		m.home.dropMemberClaim(mk) // a copy without its key's record (a claim cut before its record): no claim
		p.mu.Lock()
		pl := p.byTpl[tpl]
		fits := pl != nil && sb.State == driver.StateRunning && m.memberFits(ctx, pl.spec.Shape, mb, "")
		full := pl != nil && len(pl.ready) >= pl.spec.Size
		if fits && !full {
			pl.ready = append(pl.ready, mb)
		}
		p.mu.Unlock()
		if !fits || full {
			m.drainMember(ctx, p, mb)
			continue
		}
		m.remember(mk, sb)
		if dir := m.channelDir(mk); dir != "" {
			_ = os.MkdirAll(dir, 0o755)
		}
		m.listenerWith(mk, m.verifier(mb.current)) // its agent redials with its backoff
	}
	return nil
}

func memberIDOf(user string) string {
	for i := len(user) - 1; i >= 0; i-- {
		if user[i] == '/' {
			return user[i+1:]
		}
	}
	return ""
}

// claimantOf is the key that claimed the pool member sb, if it was claimed: sb keeps the member's name (or, claimed
// by an older version, has the key's).
func (m *Manager) claimantOf(sb *driver.Sandbox) (identity.Key, bool) {
	if _, shared := m.claimKeeper(); shared {
		c, ok := driver.ClaimOf(sb)
		k, err := identity.New(c.Tenant, c.User)
		if !ok || err != nil || k.Hex() != c.Key || sb.Labels[driver.LabelInstallation] != m.home.Installation {
			return identity.Key{}, false
		}
		return k, true
	}
	tpl := sb.Labels[driver.LabelPool]
	mk := identity.Member(tpl, memberIDOf(sb.Labels[driver.LabelUser]))
	if mk.Hex() != sb.Labels[driver.LabelKey] || sb.Labels[driver.LabelInstallation] != m.home.Installation {
		return identity.Key{}, false
	}
	k, ok := m.home.claimant(mk)
	if !ok || (sb.Name != mk.MemberName() && sb.Name != k.ContainerName()) {
		return identity.Key{}, false
	}
	return k, true
}
