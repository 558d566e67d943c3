package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Decision is what ensure did to provide a running sandbox.
type Decision string

// Decisions, in the words operators read in logs and (later) events.
const (
	DecisionReuse    Decision = "reuse"    // running and compatible
	DecisionStart    Decision = "start"    // stopped and compatible
	DecisionRecreate Decision = "recreate" // drifted (image, posture) or in a state that cannot run commands
	DecisionCreate   Decision = "create"   // absent
	DecisionAdopt    Decision = "adopt"    // another process created it first
	DecisionClaim    Decision = "claim"    // absent, and its template's warm pool had a member ready (pool.go)
)

// ensure returns key's running, compatible sandbox and what it did to get it, within SetupTimeout. The caller
// holds key's gate.
func (m *Manager) ensure(ctx context.Context, key identity.Key, sh *Shape) (*driver.Sandbox, Decision, error) {
	sctx, cancel := context.WithTimeout(ctx, m.cfg.SetupTimeout)
	defer cancel()
	sb, d, err := m.provide(sctx, key, sh)
	if err == nil && len(sh.cfg.Companions) > 0 {
		err = m.ensureCompanions(sctx, key, sh, sb, d) // companions.go
	}
	if err != nil && ctx.Err() == nil && (sctx.Err() != nil || errors.Is(err, context.DeadlineExceeded)) {
		return nil, "", fault.Wrap(err, fault.SandboxSetupTimeout,
			"retry; if it keeps happening, pull or build the image ahead of time (or raise the setup bound)",
			"providing the sandbox for %s (image pull, create, start, post-create) stalled past its bound of %s",
			key, m.cfg.SetupTimeout)
	}
	return sb, d, err
}

// provide is ensure's body: reuse, start, recreate, create or adopt.
func (m *Manager) provide(ctx context.Context, key identity.Key, sh *Shape) (*driver.Sandbox, Decision, error) {
	imageID, err := m.images.resolve(ctx, sh.cfg.Image)
	if err != nil {
		logf(ctx, LogDriver, "%s: image %s: %v", m.drv.Name(), sh.cfg.Image, err)
		return nil, "", err
	}
	// A new key whose template keeps a warm pool takes a member that is running and connected already.
	if sb, ok, err := m.claim(ctx, key, sh, imageID); err != nil {
		return nil, "", err
	} else if ok {
		return sb, DecisionClaim, nil
	}
	chanDir := m.channelDir(key)
	m.listenerFor(key) // exec left it to the claim (mayClaim); before a create or start, the agent dials it
	want, hash, err := m.postureOf(key, sh)
	if err != nil {
		return nil, "", err
	}
	if sb := m.cached(key); sb != nil && compatible(sb, imageID, hash) {
		// Trust this process's last ensure: if the sandbox was stopped or removed since, Exec fails before
		// running anything and the caller ensures again.
		logf(ctx, LogDriver, "%s: reuse sandbox %s (running, image %s)", m.drv.Name(), sb.Name, sh.cfg.Image)
		return sb, DecisionReuse, nil
	}
	if chanDir != "" { // a bind source must exist when the sandbox is created and each time it starts
		if err := os.MkdirAll(chanDir, 0o755); err != nil {
			return nil, "", fmt.Errorf("channel dir: %w", err)
		}
	}
	adopted := false
	for range 3 {
		sb, err := m.inspectKey(ctx, key)
		switch {
		case cerrdefs.IsNotFound(err):
			began := time.Now()
			logf(ctx, LogDriver, "%s: create sandbox %s from image %s (%s)", m.drv.Name(), key.ContainerName(), sh.cfg.Image, imageID)
			sb, err = m.create(ctx, key, sh, want, hash, imageID)
			if cerrdefs.IsConflict(err) { // another process won the name: inspect it and adopt it
				logf(ctx, LogDriver, "%s: another process created %s first: adopt it", m.drv.Name(), key.ContainerName())
				adopted = true
				continue
			}
			if err != nil {
				logf(ctx, LogDriver, "%s: create %s failed: %v", m.drv.Name(), key.ContainerName(), err)
				return nil, "", err
			}
			logf(ctx, LogDriver, "%s: created and started %s (id %s) in %dms", m.drv.Name(), sb.Name, sb.ID, time.Since(began).Milliseconds())
			m.decided(key, sb, DecisionCreate)
			m.emit(ctx, events.NameSandboxStarted, events.SandboxStarted{Sandbox: sb.Name, Driver: m.drv.Name(),
				Image: sh.cfg.Image, Created: true, DurationMS: time.Since(began).Milliseconds()})
			m.imageEnvPlanted(ctx, sb, sh.cfg.Image, imageID, want.Env) // imageenv.go
			running, d, err := m.started(ctx, key, sb, DecisionCreate)
			if err != nil {
				return nil, "", err
			}
			if err := m.postCreate(ctx, key, running, sh); err != nil {
				return nil, "", err
			}
			if err := m.postStart(ctx, running, sh); err != nil {
				return nil, "", err
			}
			m.resumed(ctx, key, running, began) // suspend.go
			return running, d, nil
		case err != nil:
			logf(ctx, LogDriver, "%s: inspect %s failed: %v", m.drv.Name(), key.ContainerName(), err)
			return nil, "", err
		}
		if err := m.checkOurs(key, sb); err != nil {
			return nil, "", err
		}
		ok := compatible(sb, imageID, hash)
		switch {
		case ok && sb.State == driver.StateRunning:
			adopted = m.announceChannel(ctx, key, sb) || adopted // follow.go: its agent dials this process now
			d := pick(adopted, DecisionAdopt, DecisionReuse)
			m.decided(key, sb, d)
			if d == DecisionAdopt {
				m.emit(ctx, events.NameSandboxAdopted, events.SandboxAdopted{Sandbox: sb.Name, Driver: m.drv.Name()})
			}
			logf(ctx, LogDriver, "%s: %s sandbox %s (running, id %s)", m.drv.Name(), d, sb.Name, sb.ID)
			m.remember(key, sb)
			return sb, d, nil
		case ok && sb.State == driver.StateStopped:
			d := pick(adopted, DecisionAdopt, DecisionStart)
			m.decided(key, sb, d)
			if _, err := m.ensureWorkspace(ctx, key, sh, true); err != nil {
				return nil, "", err
			}
			began := time.Now()
			logf(ctx, LogDriver, "%s: start stopped sandbox %s (id %s)", m.drv.Name(), sb.Name, sb.ID)
			if err := m.drv.Start(ctx, sb); err == nil {
				m.emit(ctx, events.NameSandboxStarted, events.SandboxStarted{Sandbox: sb.Name, Driver: m.drv.Name(),
					Image: sh.cfg.Image, DurationMS: time.Since(began).Milliseconds()})
				running, d, err := m.started(ctx, key, sb, d)
				if err != nil {
					return nil, "", err
				}
				if err := m.postStart(ctx, running, sh); err != nil {
					return nil, "", err
				}
				return running, d, nil
			} else if ctx.Err() != nil {
				return nil, "", err // the caller gave up: a start cut short says nothing about the sandbox
			} else {
				logf(ctx, LogDriver, "%s: start %s failed: %v; recreate it", m.drv.Name(), sb.Name, err)
			}
			// A stopped container that will not start is recreated, like a dead one.
		}
		m.decided(key, sb, DecisionRecreate)
		reason := recycleReason(ok, sb.Labels[driver.LabelImageID] == imageID)
		m.emit(ctx, events.NameSandboxRecycled, events.SandboxRecycled{Sandbox: sb.Name, Reason: reason})
		logf(ctx, LogDriver, "%s: recreate sandbox %s (id %s, %s): %s", m.drv.Name(), sb.Name, sb.ID, sb.State, reason)
		m.forget(key)
		if err := m.drv.Remove(ctx, sb); err != nil {
			logf(ctx, LogDriver, "%s: remove %s failed: %v", m.drv.Name(), sb.Name, err)
			return nil, "", fmt.Errorf("recreate %s: %w", sb.Name, err)
		}
	}
	return nil, "", fmt.Errorf("ensure sandbox %s: the container kept changing under us: %w", key.Short(), cerrdefs.ErrConflict)
}

// create makes key's container (workspace first, so the bind source exists with the right owner) and
// starts it; a half-made container is removed when the start fails.
//
// On a driver that keeps the claims (a Kubernetes cluster, whose workspace claims are named after the sandbox), a
// key that claimed a pool member gets its sandbox back under the member's name and identity, claimed from its
// creation: it keeps the member's workspace claim, and every replica still finds it as key's.
func (m *Manager) create(ctx context.Context, key identity.Key, sh *Shape, want driver.Posture, hash, imageID string) (*driver.Sandbox, error) {
	spec := m.createSpec(key, sh, want, hash, imageID)
	if rec, ok := m.home.readClaim(key); ok && rec.Done {
		if _, shared := m.claimKeeper(); shared {
			mk := rec.member()
			spec.Name = mk.MemberName()
			spec.Labels[driver.LabelTenant], spec.Labels[driver.LabelUser], spec.Labels[driver.LabelKey] = "", mk.User, mk.Hex()
			spec.Labels[driver.LabelPool] = rec.Template
			spec.Claim = &driver.Claim{Key: key.Hex(), Tenant: key.Tenant, User: key.User}
		}
	}
	return m.createFrom(ctx, key, sh, spec)
}

// createFrom makes the sandbox of spec for key (a warm pool member's key, for a member) and starts it.
func (m *Manager) createFrom(ctx context.Context, key identity.Key, sh *Shape, spec *driver.CreateSpec) (*driver.Sandbox, error) {
	if _, err := m.ensureWorkspace(ctx, key, sh, true); err != nil {
		return nil, err
	}
	sb, err := m.drv.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	if err := m.drv.Start(ctx, sb); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = m.drv.Remove(cctx, sb)
		return nil, err
	}
	return sb, nil
}

// createSpec is what key's sandbox in shape sh is created from: its name, image, posture and labels.
func (m *Manager) createSpec(key identity.Key, sh *Shape, want driver.Posture, hash, imageID string) *driver.CreateSpec {
	spec := &driver.CreateSpec{
		Key: key, Name: key.ContainerName(), Image: sh.cfg.Image, ImageID: imageID, Posture: want,
		Labels: map[string]string{
			driver.LabelTenant:       key.Tenant,
			driver.LabelUser:         key.User,
			driver.LabelKey:          key.Hex(),
			driver.LabelImage:        sh.cfg.Image,
			driver.LabelImageID:      imageID,
			driver.LabelPosture:      hash,
			driver.LabelInstallation: m.home.Installation,
			driver.LabelCreatedAt:    m.cfg.Now().UTC().Format(time.RFC3339),
		},
	}
	if sh.Template != "" {
		spec.Labels[driver.LabelTemplate] = sh.Template
	}
	return spec
}

// started records a sandbox that was just started as running.
func (m *Manager) started(ctx context.Context, key identity.Key, sb *driver.Sandbox, d Decision) (*driver.Sandbox, Decision, error) {
	now, err := m.drv.Inspect(ctx, sb.Name) // the contract looks sandboxes up by name, not ID
	if err != nil {
		return nil, "", err
	}
	if now.ID != sb.ID {
		return nil, "", fmt.Errorf("sandbox %s was replaced right after start: %w", sb.Name, cerrdefs.ErrConflict)
	}
	if now.State != driver.StateRunning {
		return nil, "", fmt.Errorf("sandbox %s is %s right after start: %w", sb.Name, now.State, cerrdefs.ErrUnavailable)
	}
	m.remember(key, now)
	return now, d, nil
}

func compatible(sb *driver.Sandbox, imageID, postureHash string) bool {
	return sb.Labels[driver.LabelImageID] == imageID && sb.Labels[driver.LabelPosture] == postureHash
}

func pick(cond bool, a, b Decision) Decision {
	if cond {
		return a
	}
	return b
}

func (m *Manager) decided(key identity.Key, sb *driver.Sandbox, d Decision) {
	m.cfg.Logger.Debug("ensure", "key", key.Short(), "sandbox", sb.Name, "state", sb.State, "decision", d)
}

// keyPosture is a key's posture and its hash.
type keyPosture struct {
	posture driver.Posture
	hash    string
}

// postureOf returns key's posture in shape sh and its hash. Both are a pure function of the shape (fixed when it
// was made) and the key (its uid, when the operator gave a range), so they are built once per key and shape
// rather than on every command; the driver only reads them.
func (m *Manager) postureOf(key identity.Key, sh *Shape) (driver.Posture, string, error) {
	if kp, ok := sh.postures.load(key.Hex()); ok {
		return kp.posture, kp.hash, nil
	}
	uid, gid, err := m.idOf(key, sh)
	if err != nil {
		return driver.Posture{}, "", err
	}
	p := sh.cfg.posture(m.home.Workspace(key), m.home.volumesRoot(key, sh.cfg.DiskBytes > 0), m.agentDir, m.channelDir(key), uid, gid)
	if sh.Template != "" {
		// The template is part of what the sandbox is: asking for another one recycles it, even when both
		// happen to describe the same container.
		p.Env = append(p.Env, EnvTemplate+"="+sh.Template)
	}
	p.Companions = companionsHash(sh.cfg.Companions) // companions.go; "" without companions
	if _, ok := m.drv.(driver.AgentRelayer); ok && len(p.Init) > 0 {
		// Init takes relayed sessions (relay.go) whatever this process's runtime or transport, so that processes
		// with different settings agree on the posture.
		p.Init = append(slices.Clip(p.Init), "--relay")
	}
	kp := keyPosture{posture: p, hash: p.Hash()}
	if ph, ok := m.drv.(driver.PostureHasher); ok {
		kp.hash = ph.PostureHash(p)
	}
	sh.postures.store(key.Hex(), kp)
	return kp.posture, kp.hash, nil
}

// IdentityOf is the uid and gid key's sandbox runs as in shape sh (nil: the Manager's own): its User, or with a
// uid range the key's own uid, allocated now when it has none yet.
func (m *Manager) IdentityOf(key identity.Key, sh *Shape) (uid, gid int, err error) {
	return m.idOf(key, m.shapeOf(sh))
}

// idOf is the host uid and gid key's sandbox runs as in shape sh: its User, or with a uid range the key's own uid
// (its gid is the same number). An allocated uid is remembered (a bounded cache: the home keeps it anyway).
func (m *Manager) idOf(key identity.Key, sh *Shape) (uid, gid int, err error) {
	if m.cfg.UIDs.Count == 0 {
		return sh.uid, sh.gid, nil
	}
	if id, ok := m.uids.load(key.Hex()); ok {
		return id, id, nil
	}
	// A key that claimed a pool member has the member's uid: the claim record names the member, whose uid was
	// allocated when it was made (claims.go).
	id, err := m.home.AllocateUID(m.home.phys(key), m.cfg.UIDs, HostIDTaken)
	if err != nil {
		return 0, 0, err
	}
	m.uids.store(key.Hex(), id)
	return id, id, nil
}

// ensureWorkspace creates key's workspace owned by its sandbox's uid (handing over what is inside when that uid
// changed, e.g. when the operator set a uid range), on its quota file system when the shape sets one (quota.go).
// stopped says the key's sandbox is not running, so a quota raised since may grow the file system.
// A workspace handed over from another uid is a sandbox_user_remap; one this process could not hand over (it does
// not run as root) a sandbox_uid_mismatch_warning.
func (m *Manager) ensureWorkspace(ctx context.Context, key identity.Key, sh *Shape, stopped bool) (string, error) {
	uid, gid, err := m.idOf(key, sh)
	if err != nil {
		return "", err
	}
	if sh.cfg.DiskBytes > 0 {
		if _, err := m.workspaceOwned(ctx, key, uid, gid); err != nil { // the mount point
			return "", err
		}
		q := Quota{Bytes: sh.cfg.DiskBytes, Inodes: sh.cfg.DiskInodes}
		if err := m.home.ensureQuotaMount(key, q, uid, gid, stopped); err != nil {
			return "", err
		}
	}
	for _, v := range sh.cfg.Volumes {
		if err := m.home.EnsureVolume(key, v, uid, gid, sh.cfg.DiskBytes > 0); err != nil {
			return "", err
		}
	}
	return m.workspaceOwned(ctx, key, uid, gid)
}

// workspaceOwned is Home.EnsureWorkspace, with the events of what it found of the workspace's owner.
func (m *Manager) workspaceOwned(ctx context.Context, key identity.Key, uid, gid int) (string, error) {
	dir, own, err := m.home.ensureWorkspace(key, uid, gid)
	if err != nil {
		return "", err
	}
	if own.handedFrom >= 0 {
		from := own.handedFrom
		m.emit(ctx, events.NameUserRemap, events.UserRemap{Origin: events.RemapWorkspace, Sandbox: key.ContainerName(),
			FromUID: &from, UID: uid, GID: gid})
	}
	if own.mismatch >= 0 {
		m.emit(ctx, events.NameUIDMismatch, events.UIDMismatch{Sandbox: key.ContainerName(), OwnerUID: own.mismatch, UID: uid})
	}
	return dir, nil
}
