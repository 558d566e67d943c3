package lifecycle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Suspend: an idle sandbox of a template with suspend_after costs nothing. The sweeper removes its container (on
// kubernetes its pod and record) and keeps its workspace (the home's directory, or the PersistentVolumeClaim,
// which outlives the record by design); the key's next command finds no sandbox, creates one over the kept
// workspace and says so (sandbox_resumed, with what the resume added to that command). A suspend never removes
// a workspace: only Remove without keepWorkspace (and retention, which lists sandboxes and so never sees a
// suspended key) does.
//
// A claimed warm-pool member is never suspended: its workspace is named after the member, not the key, and a
// new sandbox of the key would not find it. It is idle-stopped as before.

// suspendAfter is how long sb may stay idle before it is suspended; 0: never.
func (m *Manager) suspendAfter(sb *driver.Sandbox) time.Duration {
	if sb.Labels[driver.LabelPool] != "" {
		return 0
	}
	return m.cfg.SuspendAfter[sb.Labels[driver.LabelTemplate]]
}

// pausesOnRetention: sb's template suspends it rather than have it removed past retention. A claimed pool member
// is removed as before (its workspace is named after the member: see above).
func (m *Manager) pausesOnRetention(sb *driver.Sandbox) bool {
	return sb.Labels[driver.LabelPool] == "" && m.cfg.PauseOnRetention[sb.Labels[driver.LabelTemplate]]
}

// suspendable: of a template with suspend_after, running or stopped, and unused for that long.
func (m *Manager) suspendable(key identity.Key, sb *driver.Sandbox) bool {
	after := m.suspendAfter(sb)
	if after <= 0 || (sb.State != driver.StateRunning && sb.State != driver.StateStopped) {
		return false
	}
	return m.cfg.Now().Sub(m.idleSince(key, sb)) >= after
}

// idleSince is when key's sandbox sb was last used (or made, when that is later).
func (m *Manager) idleSince(key identity.Key, sb *driver.Sandbox) time.Time {
	used := m.home.LastUsed(key)
	if created, err := time.Parse(time.RFC3339, sb.Labels[driver.LabelCreatedAt]); err == nil && created.After(used) {
		used = created
	}
	return used
}

// suspend removes sb, key's sandbox, and keeps its workspace. The caller holds key's gate and has checked
// suspendable under it. The marker is written only once the sandbox is gone, so a failed removal never makes a
// later create read as a resume.
func (m *Manager) suspend(ctx context.Context, key identity.Key, sb *driver.Sandbox, rep *SweepReport, reason string) error {
	idle := m.cfg.Now().Sub(m.idleSince(key, sb))
	m.forget(key)
	m.dropEgress(key)
	if err := m.drv.Remove(ctx, sb); err != nil {
		return fmt.Errorf("suspend %s: %w", sb.Name, err)
	}
	m.dropListener(key)
	if err := m.home.markSuspended(key, m.cfg.Now()); err != nil {
		m.cfg.Logger.Warn("suspend: the marker was not written; the resume will read as a create", "sandbox", sb.Name, "err", err)
	}
	rep.Suspended = append(rep.Suspended, sb.Name)
	m.emit(ctx, events.NameSandboxSuspended, events.SandboxSuspended{Sandbox: sb.Name,
		Template: sb.Labels[driver.LabelTemplate], IdleMS: idle.Milliseconds(), Reason: reason})
	m.cfg.Logger.Info("sweeper suspended idle sandbox", "sandbox", sb.Name, "key", key.Short())
	return nil
}

// resumed tells, after a create of key's sandbox sb, whether it resumed a suspended key: then it emits
// sandbox_resumed (began is when the command began providing the sandbox) and drops the marker.
func (m *Manager) resumed(ctx context.Context, key identity.Key, sb *driver.Sandbox, began time.Time) {
	at, ok := m.home.suspendedAt(key)
	if !ok {
		return
	}
	m.home.clearSuspended(key)
	m.emit(ctx, events.NameSandboxResumed, events.SandboxResumed{Sandbox: sb.Name, Driver: m.drv.Name(),
		Template: sb.Labels[driver.LabelTemplate], SuspendedMS: m.cfg.Now().Sub(at).Milliseconds(),
		DurationMS: time.Since(began).Milliseconds()})
	logf(ctx, LogDriver, "%s: resumed suspended sandbox %s in %dms", m.drv.Name(), sb.Name, time.Since(began).Milliseconds())
}

// suspendedPath is key's suspend marker: its content is when it was suspended (Unix milliseconds).
func (h *Home) suspendedPath(k identity.Key) string {
	return filepath.Join(h.Dir, "suspended", k.Hex())
}

func (h *Home) markSuspended(k identity.Key, at time.Time) error {
	p := h.suspendedPath(k)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(strconv.FormatInt(at.UnixMilli(), 10)), 0o600)
}

func (h *Home) suspendedAt(k identity.Key) (time.Time, bool) {
	b, err := os.ReadFile(h.suspendedPath(k))
	if err != nil {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return time.Time{}, true // a marker we cannot read still says the key was suspended
	}
	return time.UnixMilli(ms), true
}

func (h *Home) clearSuspended(k identity.Key) { _ = os.Remove(h.suspendedPath(k)) }
