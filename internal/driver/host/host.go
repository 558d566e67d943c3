// Package host is the passthrough driver: it runs commands directly on this host, WITHOUT ANY ISOLATION. It
// exists for the two cases policy allows (internal/policy.Decide): mode none, and mode auto degrading when no
// sandboxing driver is usable. Nothing else may choose it.
//
// A "sandbox" here is a record in this process's memory (per Driver; nothing is persisted) pointing at a host
// directory: the source of the CreateSpec's /workspace mount. Start and Stop flip its state; Remove forgets it
// and leaves the directory alone. Every command runs through `sandkeep-agent serve`, started as a child of this
// process, so that deadlines, process-tree kills, output bounds and exit statuses behave exactly as in a
// container.
//
// What it does not do, by design or because the host cannot: no user switch beyond the one the operator names
// (NewAs; else commands run as the user sandkeep runs as; the posture's User is ignored rather than becoming
// some other local account), no capability drop, no
// read-only root, no resource limits, no network policy, no other mounts (commands see the host's own paths),
// no images (ResolveImage answers a fixed pseudo-ID). The workspace is only the starting directory and HOME:
// a command can read and write anything the sandkeep user can. Secret files are not delivered (policy reports
// them as dropped).
//
// What it does guarantee: the environment of a command is built explicitly (the host's PATH, the posture's
// Env, HOME set to the workspace, then the request's Env), so nothing from sandkeep's own environment leaks
// into it; and a workdir outside /workspace is refused.
package host

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// Name is the driver's name.
const Name = "host"

// ImageID is what ResolveImage returns for every well-formed ref: images do not apply on the host.
const ImageID = "host"

// defaultPath is the PATH commands get when sandkeep's own environment has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// maxImageRef bounds an image ref; longer is not a ref.
const maxImageRef = 1024

// Driver is the host passthrough driver. It is safe for concurrent use. The zero value is not usable; call New.
type Driver struct {
	agent string              // the sandkeep-agent binary on this host, run as `agent serve` for each command
	as    *syscall.Credential // the host user commands run as (NewAs); nil: sandkeep's own

	mu    sync.Mutex      // guards boxes and the fields of every box
	boxes map[string]*box // by sandbox name; only what this Driver created
}

var _ driver.Driver = (*Driver)(nil)

// New returns a driver that runs commands through the sandkeep-agent binary at agentPath. It does not touch the
// binary; Ping checks it.
func New(agentPath string) *Driver {
	return &Driver{agent: agentPath, boxes: map[string]*box{}}
}

// NewAs is New with every command run as the host user uid:gid, without supplementary groups, and each
// sandbox's workspace handed to that user: what a multi-tenant server needs when its operator lets it degrade
// to the host at all (sandkeep serve's host_passthrough.user). uid or gid 0 is refused: a tenant's command never
// runs as root on the host. Switching to another user needs sandkeep to run as root; otherwise uid must be
// sandkeep's own.
func NewAs(agentPath string, uid, gid uint32) (*Driver, error) {
	if uid == 0 || gid == 0 {
		return nil, fault.New(fault.InvalidArgument, "name an unprivileged host user, e.g. host_passthrough: {user: \"1500:1500\"}",
			"the host passthrough may not run commands as root (uid:gid %d:%d)", uid, gid)
	}
	euid := os.Geteuid()
	if euid != 0 && uint32(euid) != uid {
		return nil, fault.New(fault.InvalidArgument, "run sandkeep as root, or name its own uid",
			"sandkeep runs as uid %d and cannot run commands as uid %d", euid, uid)
	}
	// As root, Groups empty drops every supplementary group; otherwise there is nothing to drop, and setgroups
	// would fail without CAP_SETGID.
	cred := &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}, NoSetGroups: euid != 0}
	return &Driver{agent: agentPath, as: cred, boxes: map[string]*box{}}, nil
}

// box is one sandbox; its fields are guarded by Driver.mu.
type box struct {
	sb        driver.Sandbox
	workspace string             // the host directory standing for /workspace
	env       []string           // the agent's environment, built once at Create
	procs     map[*proc]struct{} // commands running in it
}

func (b *box) snapshot() *driver.Sandbox { return b.sb.Clone() }

// Name is "host".
func (d *Driver) Name() string { return Name }

// Capabilities: sandboxes (directories) persist between commands; nothing else is offered.
func (d *Driver) Capabilities() driver.Capabilities { return driver.Capabilities{Persistent: true} }

// Ping runs `sandkeep-agent version`: the host driver is usable when its agent runs.
func (d *Driver) Ping(ctx context.Context) error {
	hint := "build cmd/sandkeep-agent and point sandkeep at it"
	if d.agent == "" || !filepath.IsAbs(d.agent) {
		return fault.New(fault.AgentMissing, hint, "the host driver's agent path %q is not absolute", d.agent)
	}
	cmd := exec.CommandContext(ctx, d.agent, "version")
	cmd.Env = []string{"PATH=" + defaultPath}
	cmd.WaitDelay = time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("ping host driver: %w", context.Cause(ctx))
		}
		return fault.Wrap(err, fault.AgentMissing, hint, "the agent %s does not run: %v %q", d.agent, err, bound(out, 256))
	}
	return nil
}

// ResolveImage returns ImageID for any well-formed ref: the host runs what is installed on it, whatever image
// a spec names. A ref that is empty, too long, or has spaces or control characters is not a ref at all and is
// IMAGE_UNAVAILABLE, as in any driver.
func (d *Driver) ResolveImage(ctx context.Context, ref string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if ref == "" || len(ref) > maxImageRef || strings.ContainsFunc(ref, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return "", fault.Wrap(errdefs.ErrInvalidArgument, fault.ImageUnavailable, "name an image as registry/name:tag",
			"image ref %q is malformed", ref)
	}
	return ImageID, nil
}

// Inspect returns a copy of the sandbox named name; errdefs.ErrNotFound when this Driver has none.
func (d *Driver) Inspect(ctx context.Context, name string) (*driver.Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[name]
	if !ok {
		return nil, fmt.Errorf("inspect %s: %w", name, errdefs.ErrNotFound)
	}
	return b.snapshot(), nil
}

// Create records a stopped sandbox for spec. Its workspace is the source of the posture's /workspace mount,
// which must be an existing directory (errdefs.ErrInvalidArgument otherwise, as is an empty name); a taken
// name is errdefs.ErrConflict. Other mounts are ignored: commands see the host's own paths.
func (d *Driver) Create(ctx context.Context, spec *driver.CreateSpec) (*driver.Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if spec.Name == "" {
		return nil, fmt.Errorf("create: empty name: %w", errdefs.ErrInvalidArgument)
	}
	ws, err := workspaceOf(spec)
	if err != nil {
		return nil, err
	}
	if d.as != nil && os.Geteuid() == 0 {
		// The workspace directory itself (not what is in it: it is new, or was this user's already).
		if err := os.Lchown(ws, int(d.as.Uid), int(d.as.Gid)); err != nil {
			return nil, fmt.Errorf("create %s: hand the workspace to uid %d: %w", spec.Name, d.as.Uid, err)
		}
		if err := reachable(ws, d.as); err != nil {
			return nil, err
		}
	}
	b := &box{workspace: ws, env: baseEnv(spec.Posture.Env, ws), procs: map[*proc]struct{}{}}
	b.sb = driver.Sandbox{
		ID:      newID(),
		Name:    spec.Name,
		State:   driver.StateStopped,
		Labels:  maps.Clone(spec.Labels),
		ImageID: spec.ImageID,
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, taken := d.boxes[spec.Name]; taken {
		return nil, fmt.Errorf("create %s: name in use: %w", spec.Name, errdefs.ErrConflict)
	}
	d.boxes[spec.Name] = b
	return b.snapshot(), nil
}

// workspaceOf returns the host directory bound at /workspace.
func workspaceOf(spec *driver.CreateSpec) (string, error) {
	for _, m := range spec.Posture.Mounts {
		if path.Clean(m.Target) != driver.WorkspaceDir {
			continue
		}
		if !filepath.IsAbs(m.Source) {
			return "", fmt.Errorf("create %s: workspace %q is not absolute: %w", spec.Name, m.Source, errdefs.ErrInvalidArgument)
		}
		if fi, err := os.Stat(m.Source); err != nil || !fi.IsDir() {
			return "", fmt.Errorf("create %s: workspace %q is not a directory: %w", spec.Name, m.Source, errdefs.ErrInvalidArgument)
		}
		return filepath.Clean(m.Source), nil
	}
	return "", fmt.Errorf("create %s: the posture binds nothing at %s, and the host driver runs only in a workspace: %w",
		spec.Name, driver.WorkspaceDir, errdefs.ErrInvalidArgument)
}

// baseEnv is the agent's whole environment: the host's PATH, the posture's Env (the sandbox's base environment,
// later entries winning), and HOME set to the workspace (the posture's HOME names a directory in a container).
// Nothing else from this process's environment is passed on.
func baseEnv(posture []string, workspace string) []string {
	p := os.Getenv("PATH")
	if p == "" {
		p = defaultPath
	}
	env := []string{"PATH=" + p}
	env = append(env, posture...)
	return append(env, "HOME="+workspace) // exec.Cmd keeps the last value of a key
}

func newID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// lookup returns the box sb refers to, or nil. A stale *Sandbox whose name now belongs to a newer sandbox does
// not find it. Callers hold d.mu.
func (d *Driver) lookup(sb *driver.Sandbox) *box {
	b, ok := d.boxes[sb.Name]
	if !ok || (sb.ID != "" && sb.ID != b.sb.ID) {
		return nil
	}
	return b
}

// Start marks the sandbox running; a running one is left alone, an absent one is errdefs.ErrNotFound. A
// workspace that disappeared is SANDBOX_FAILED, as a container whose bind source is gone would be.
func (d *Driver) Start(ctx context.Context, sb *driver.Sandbox) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.lookup(sb)
	if b == nil {
		return fmt.Errorf("start %s: %w", sb.Name, errdefs.ErrNotFound)
	}
	if b.sb.State == driver.StateRunning {
		return nil
	}
	if fi, err := os.Stat(b.workspace); err != nil || !fi.IsDir() {
		return fault.Wrap(err, fault.SandboxFailed, "recreate the sandbox", "the workspace %s of sandbox %s is gone", b.workspace, sb.Name)
	}
	b.sb.State, b.sb.StartedAt = driver.StateRunning, time.Now().UTC()
	return nil
}

// Stop marks the sandbox stopped and ends its running commands: each agent's stdin is closed, so it kills its
// command's tree with the request's grace; an agent that is not gone within that grace plus
// agentproto.ReportSlack (or by ctx's end) is killed itself, and then descendants of its command may survive.
// Those commands fail with an error wrapping agentproto.ErrProtocol. Absent or stopped is not an error. grace is
// not used: each command's own grace applies.
func (d *Driver) Stop(ctx context.Context, sb *driver.Sandbox, grace time.Duration) error {
	procs := d.halt(sb)
	return endProcs(ctx, procs, fmt.Errorf("sandbox %s stopped during the command: %w", sb.Name, agentproto.ErrProtocol))
}

// halt moves a running sandbox to stopped and returns the commands running in it.
func (d *Driver) halt(sb *driver.Sandbox) []*proc {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.lookup(sb)
	if b == nil || b.sb.State != driver.StateRunning {
		return nil
	}
	b.sb.State, b.sb.FinishedAt = driver.StateStopped, time.Now().UTC()
	return slices.Collect(maps.Keys(b.procs))
}

// Remove forgets the sandbox, ending its commands as Stop does. The workspace directory is not touched. Absent
// is not an error.
func (d *Driver) Remove(ctx context.Context, sb *driver.Sandbox) error {
	d.mu.Lock()
	b := d.lookup(sb)
	var procs []*proc
	if b != nil {
		delete(d.boxes, b.sb.Name)
		procs = slices.Collect(maps.Keys(b.procs))
	}
	d.mu.Unlock()
	return endProcs(ctx, procs, fmt.Errorf("sandbox %s removed during the command: %w", sb.Name, agentproto.ErrProtocol))
}

// List returns copies of the sandboxes labelled with installation, sorted by name.
func (d *Driver) List(ctx context.Context, installation string) ([]*driver.Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*driver.Sandbox
	for _, b := range d.boxes {
		if v, ok := b.sb.Labels[driver.LabelInstallation]; ok && v == installation {
			out = append(out, b.snapshot())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// endProcs ends procs (see Stop) and waits for them.
func endProcs(ctx context.Context, procs []*proc, reason error) error {
	for _, p := range procs {
		p.end(reason)
	}
	var errs []error
	for _, p := range procs {
		if err := p.waitEnded(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func bound(b []byte, n int) string {
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}

// reachable makes sure the user as can reach ws, whose directories above it belong to sandkeep's state home
// (workspaces/, the home itself: made 0700): the two levels sandkeep owns get the traverse bit for others (0711:
// nobody may list them, and each workspace is 0700 of its user), and every directory above must already let
// the user through. Otherwise the agent, started as the user in ws, fails with EACCES.
func reachable(ws string, as *syscall.Credential) error {
	dir := filepath.Dir(ws)
	for i := 0; dir != filepath.Dir(dir); i, dir = i+1, filepath.Dir(dir) {
		var st syscall.Stat_t
		if err := syscall.Stat(dir, &st); err != nil {
			return fmt.Errorf("workspace's parent %s: %w", dir, err)
		}
		if traversable(st, as) {
			continue
		}
		if i < 2 && st.Uid == uint32(os.Geteuid()) {
			if err := os.Chmod(dir, os.FileMode(st.Mode&0o777|0o011)); err != nil {
				return fmt.Errorf("let uid %d through %s: %w", as.Uid, dir, err)
			}
			continue
		}
		return fault.New(fault.AgentMissing,
			"give the state home a parent the user can traverse (e.g. --home /var/lib/sandkeep), not a 0700 home such as /root",
			"the host user %d:%d (host_passthrough.user) cannot reach its workspace: %s is closed to it", as.Uid, as.Gid, dir)
	}
	return nil
}

// traversable reports whether as may search the directory st describes (its supplementary groups are none).
func traversable(st syscall.Stat_t, as *syscall.Credential) bool {
	switch {
	case st.Uid == as.Uid:
		return st.Mode&0o100 != 0
	case st.Gid == as.Gid:
		return st.Mode&0o010 != 0
	default:
		return st.Mode&0o001 != 0
	}
}
