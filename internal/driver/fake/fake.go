// Package fake is an in-memory driver.Driver for testing the layers above the drivers (lifecycle, API, CLI).
// Sandboxes are map entries, images are a ref -> ID table, and Exec really runs the command on this host with
// os/exec, in a private directory standing for /workspace, so that deadlines, process-group kills, output bounds
// and exit statuses behave as they do in a sandbox. It passes the same conformance suite (drivertest) as the
// real drivers, and adds failure injection, call counters and hooks for the tests that use it.
//
// It isolates nothing: never use it outside tests.
package fake

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// Op names one driver method, for SetFault, FailNext and Calls.
type Op string

// Ops.
const (
	OpPing    Op = "ping"
	OpResolve Op = "resolve"
	OpInspect Op = "inspect"
	OpCreate  Op = "create"
	OpStart   Op = "start"
	OpStop    Op = "stop"
	OpRemove  Op = "remove"
	OpList    Op = "list"
	OpExec    Op = "exec"
	OpRename  Op = "rename"
)

// Hooks let a test observe or interfere with calls as they happen. They run on the caller's goroutine without
// the driver's lock held, so they may call back into the driver (e.g. ExternalCreate from BeforeCreate to lose
// a creation race on purpose). A nil hook is skipped.
type Hooks struct {
	// BeforeCreate runs at the start of every Create that passed fault injection, before the name is checked.
	BeforeCreate func(spec *driver.CreateSpec)
	// BeforeExec runs at the start of every Exec that passed fault injection, before the sandbox's state is
	// checked: stopping the sandbox here makes this Exec fail as "not running".
	BeforeExec func(sb *driver.Sandbox, req agentproto.Request)
}

// Driver is the fake driver. It is safe for concurrent use. The zero value is not usable; call New.
type Driver struct {
	tempDir string // parent of the private workspaces of sandboxes without a /workspace mount

	mu       sync.Mutex          // guards everything below
	images   map[string]string   // ref -> image ID, as ResolveImage answers
	imageIDs map[string]bool     // every ID ever added: a retag leaves the old image, as an engine does
	imageEnv map[string][]string // image ID -> its configured ENV lines (WithImageEnv)
	boxes    map[string]*box     // by sandbox name
	faults   map[Op]error        // failing every call until cleared
	next     map[Op][]error      // failing the next calls, one error each, before faults applies
	calls    map[Op]int          // calls made, failed ones included
	hooks    Hooks
}

var _ driver.Driver = (*Driver)(nil)

// Option configures a Driver.
type Option func(*Driver)

// WithTempDir sets where sandboxes without a /workspace mount get their private workspace (default
// os.TempDir()). Tests pass t.TempDir() so nothing outlives them.
func WithTempDir(dir string) Option { return func(d *Driver) { d.tempDir = dir } }

// WithImage makes ref resolve to id, as AddImage does.
func WithImage(ref, id string) Option { return func(d *Driver) { d.addImage(ref, id) } }

// WithImageEnv gives the image id configured ENV lines ("NAME=value"), as a Dockerfile's ENV does: its sandboxes'
// commands start with them under the posture's, and ImageEnv reports them.
func WithImageEnv(id string, env ...string) Option {
	return func(d *Driver) { d.imageEnv[id] = env }
}

// New returns an empty fake driver: no sandboxes, no images, no faults.
func New(opts ...Option) *Driver {
	d := &Driver{
		tempDir:  os.TempDir(),
		images:   map[string]string{},
		imageIDs: map[string]bool{},
		imageEnv: map[string][]string{},
		boxes:    map[string]*box{},
		faults:   map[Op]error{},
		next:     map[Op][]error{},
		calls:    map[Op]int{},
	}
	for _, o := range opts {
		o(d)
	}
	return d
}

// box is one sandbox. Its fields are guarded by Driver.mu.
type box struct {
	sb        driver.Sandbox
	workspace string             // the host directory standing for /workspace
	private   bool               // workspace is ours (no mount): it goes with the sandbox, as a container's fs does
	env       []string           // base environment of its commands: the host's PATH, then the posture's Env
	procs     map[*proc]struct{} // commands running in it
}

// snapshot is a copy the caller may keep and change.
func (b *box) snapshot() *driver.Sandbox {
	s := b.sb
	s.Labels = maps.Clone(b.sb.Labels)
	return &s
}

// Name is "fake".
func (d *Driver) Name() string { return "fake" }

// Capabilities: sandboxes persist between commands and can be pooled; nothing else is offered.
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{Persistent: true, Pools: true}
}

// AddImage makes ref resolve to id.
func (d *Driver) AddImage(ref, id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.addImage(ref, id)
}

func (d *Driver) addImage(ref, id string) {
	d.images[ref] = id
	d.imageIDs[id] = true
}

// Retag points ref at newID, as a pull of a moved tag would: sandboxes created from the old ID keep it, and the
// old ID stays creatable.
func (d *Driver) Retag(ref, newID string) { d.AddImage(ref, newID) }

// RemoveImage makes ref unresolvable (IMAGE_UNAVAILABLE). Its ID stays creatable.
func (d *Driver) RemoveImage(ref string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.images, ref)
}

// SetFault makes every call of op fail with err until SetFault(op, nil) clears it. The call is still counted.
func (d *Driver) SetFault(op Op, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		delete(d.faults, op)
		return
	}
	d.faults[op] = err
}

// FailNext makes the next call of op fail with err; queued errors are used one per call, in order, before any
// SetFault error applies.
func (d *Driver) FailNext(op Op, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next[op] = append(d.next[op], err)
}

// Calls is how many times op was called, failed calls included.
func (d *Driver) Calls(op Op) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[op]
}

// SetHooks replaces the hooks.
func (d *Driver) SetHooks(h Hooks) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hooks = h
}

func (d *Driver) currentHooks() Hooks {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hooks
}

// enter counts a call of op and returns its injected fault, if any.
func (d *Driver) enter(op Op) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls[op]++
	if q := d.next[op]; len(q) > 0 {
		d.next[op] = q[1:]
		return fmt.Errorf("fake %s: %w", op, q[0])
	}
	if err := d.faults[op]; err != nil {
		return fmt.Errorf("fake %s: %w", op, err)
	}
	return nil
}

// Ping answers unless a fault is injected.
func (d *Driver) Ping(ctx context.Context) error {
	if err := d.enter(OpPing); err != nil {
		return err
	}
	return ctx.Err()
}

// LocalImage returns the ID ref points at without pulling (this driver never pulls); an unknown ref is
// errdefs.ErrNotFound, as the Docker driver's.
func (d *Driver) LocalImage(ctx context.Context, ref string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	id, ok := d.images[ref]
	if !ok {
		return "", fmt.Errorf("image %q: %w", ref, errdefs.ErrNotFound)
	}
	return id, nil
}

// ResolveImage returns the ID ref points at; an unknown ref is IMAGE_UNAVAILABLE.
func (d *Driver) ResolveImage(ctx context.Context, ref string) (string, error) {
	if err := d.enter(OpResolve); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	id, ok := d.images[ref]
	if !ok {
		return "", fault.Wrap(errdefs.ErrNotFound, fault.ImageUnavailable, "add the image to the fake driver with AddImage",
			"image %q is not present and could not be pulled", ref)
	}
	return id, nil
}

// Inspect returns a copy of the sandbox named name; errdefs.ErrNotFound when there is none.
func (d *Driver) Inspect(ctx context.Context, name string) (*driver.Sandbox, error) {
	if err := d.enter(OpInspect); err != nil {
		return nil, err
	}
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

// Create makes a stopped sandbox for spec from spec.ImageID. A taken name is errdefs.ErrConflict; an unknown
// image ID is errdefs.ErrNotFound; a /workspace mount whose source is not a directory is
// errdefs.ErrInvalidArgument (Docker refuses a missing bind source too).
func (d *Driver) Create(ctx context.Context, spec *driver.CreateSpec) (*driver.Sandbox, error) {
	if err := d.enter(OpCreate); err != nil {
		return nil, err
	}
	if h := d.currentHooks().BeforeCreate; h != nil {
		h(spec)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return d.create(spec)
}

// ExternalCreate creates a sandbox as another process would: no hooks, faults or counters. With spec.Labels nil
// it is a foreign container that merely has the name.
func (d *Driver) ExternalCreate(spec *driver.CreateSpec) (*driver.Sandbox, error) {
	return d.create(spec)
}

func (d *Driver) create(spec *driver.CreateSpec) (*driver.Sandbox, error) {
	if spec.Name == "" {
		return nil, fmt.Errorf("create: empty name: %w", errdefs.ErrInvalidArgument)
	}
	mounted, err := workspaceMount(spec)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.imageIDs[spec.ImageID] {
		return nil, fmt.Errorf("create %s: image %q: %w", spec.Name, spec.ImageID, errdefs.ErrNotFound)
	}
	if _, taken := d.boxes[spec.Name]; taken {
		return nil, fmt.Errorf("create %s: name in use: %w", spec.Name, errdefs.ErrConflict)
	}
	b := &box{workspace: mounted, procs: map[*proc]struct{}{}}
	// The host's PATH first, so that a posture without one still finds sh; a posture PATH overrides it.
	// The image's ENV sits between them, as an engine folds an image's environment under a container's.
	b.env = append(append([]string{"PATH=" + os.Getenv("PATH")}, d.imageEnv[spec.ImageID]...), spec.Posture.Env...)
	if b.workspace == "" {
		dir, err := os.MkdirTemp(d.tempDir, "sandkeep-fake-ws-*")
		if err != nil {
			return nil, fmt.Errorf("create %s: workspace: %w", spec.Name, err)
		}
		b.workspace, b.private = dir, true
	}
	b.sb = driver.Sandbox{
		ID:      newID(),
		Name:    spec.Name,
		State:   driver.StateStopped,
		Labels:  maps.Clone(spec.Labels),
		ImageID: spec.ImageID,
	}
	d.boxes[spec.Name] = b
	return b.snapshot(), nil
}

// workspaceMount returns the host source bound at /workspace, or "" when the posture binds none. Other mounts
// are not simulated: the command runs on the host and sees the host's paths.
func workspaceMount(spec *driver.CreateSpec) (string, error) {
	for _, m := range spec.Posture.Mounts {
		if path.Clean(m.Target) != driver.WorkspaceDir {
			continue
		}
		if fi, err := os.Stat(m.Source); err != nil || !fi.IsDir() {
			return "", fmt.Errorf("create %s: workspace mount source %q is not a directory: %w",
				spec.Name, m.Source, errdefs.ErrInvalidArgument)
		}
		return m.Source, nil
	}
	return "", nil
}

func newID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// lookup returns the box sb refers to, or nil. Like an engine addressing containers by ID, a stale *Sandbox
// whose name now belongs to a newer sandbox does not find it. Callers hold d.mu.
func (d *Driver) lookup(sb *driver.Sandbox) *box {
	b, ok := d.boxes[sb.Name]
	if !ok || (sb.ID != "" && sb.ID != b.sb.ID) {
		return nil
	}
	return b
}

// Rename gives the sandbox sb (looked up by its name, as the engine does) the name name: a taken name is
// errdefs.ErrConflict, a sandbox that no longer has sb.Name errdefs.ErrNotFound. No driver contract asks for it
// any more; tests use it to make the home an older version's warm pool claim left (the member renamed to its key's
// name).
func (d *Driver) Rename(ctx context.Context, sb *driver.Sandbox, name string) error {
	if err := d.enter(OpRename); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.lookup(sb)
	if b == nil {
		return fmt.Errorf("rename %s: %w", sb.Name, errdefs.ErrNotFound)
	}
	if _, taken := d.boxes[name]; taken {
		return fmt.Errorf("rename %s to %s: %w", sb.Name, name, errdefs.ErrConflict)
	}
	delete(d.boxes, b.sb.Name)
	b.sb.Name = name
	d.boxes[name] = b
	return nil
}

// Start starts a stopped sandbox; a running one is left alone. An absent one is errdefs.ErrNotFound.
func (d *Driver) Start(ctx context.Context, sb *driver.Sandbox) error {
	if err := d.enter(OpStart); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.lookup(sb)
	if b == nil {
		return fmt.Errorf("start %s: %w", sb.Name, errdefs.ErrNotFound)
	}
	if b.sb.State != driver.StateRunning {
		b.sb.State, b.sb.StartedAt = driver.StateRunning, time.Now().UTC()
	}
	return nil
}

// Stop stops a running sandbox: its commands get SIGTERM, then SIGKILL after grace, and fail with an
// agentproto.ErrProtocol error as a cut exec stream would. Absent or already stopped is not an error.
func (d *Driver) Stop(ctx context.Context, sb *driver.Sandbox, grace time.Duration) error {
	if err := d.enter(OpStop); err != nil {
		return err
	}
	procs := d.halt(sb, driver.StateStopped)
	stopProcs(ctx, procs, grace, fmt.Errorf("sandbox %s stopped during the command: %w", sb.Name, agentproto.ErrProtocol))
	return nil
}

// halt moves a running sandbox to state and returns the commands running in it.
func (d *Driver) halt(sb *driver.Sandbox, state driver.State) []*proc {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.lookup(sb)
	if b == nil || b.sb.State != driver.StateRunning {
		return nil
	}
	b.sb.State, b.sb.FinishedAt = state, time.Now().UTC()
	return slices.Collect(maps.Keys(b.procs))
}

// Remove deletes the sandbox, killing its commands. A private workspace goes with it (it stands for the
// container's filesystem); a mounted one is not touched. Absent is not an error.
func (d *Driver) Remove(ctx context.Context, sb *driver.Sandbox) error {
	if err := d.enter(OpRemove); err != nil {
		return err
	}
	b := d.detach(sb)
	if b == nil {
		return nil
	}
	stopProcs(ctx, b.procs, 0, fmt.Errorf("sandbox %s removed during the command: %w", sb.Name, agentproto.ErrProtocol))
	if b.private {
		if err := os.RemoveAll(b.workspace); err != nil {
			return fmt.Errorf("remove %s: workspace: %w", sb.Name, err)
		}
	}
	return nil
}

// detached is what Remove needs of a box once it left the map.
type detached struct {
	workspace string
	private   bool
	procs     []*proc
}

func (d *Driver) detach(sb *driver.Sandbox) *detached {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.lookup(sb)
	if b == nil {
		return nil
	}
	delete(d.boxes, b.sb.Name)
	return &detached{workspace: b.workspace, private: b.private, procs: slices.Collect(maps.Keys(b.procs))}
}

// ExternalRemove removes the sandbox named name as another process would: no hooks, faults or counters.
func (d *Driver) ExternalRemove(name string) {
	if b := d.detach(&driver.Sandbox{Name: name}); b != nil {
		stopProcs(context.Background(), b.procs, 0, fmt.Errorf("sandbox %s removed during the command: %w", name, agentproto.ErrProtocol))
		if b.private {
			_ = os.RemoveAll(b.workspace)
		}
	}
}

// SetState forces the state of the sandbox named name, as a crash or an outside `docker stop` would; leaving
// running kills its commands at once. It returns errdefs.ErrNotFound when there is no such sandbox.
func (d *Driver) SetState(name string, state driver.State) error {
	d.mu.Lock()
	b, ok := d.boxes[name]
	if !ok {
		d.mu.Unlock()
		return fmt.Errorf("set state %s: %w", name, errdefs.ErrNotFound)
	}
	var procs []*proc
	if b.sb.State == driver.StateRunning && state != driver.StateRunning {
		procs = slices.Collect(maps.Keys(b.procs))
		b.sb.FinishedAt = time.Now().UTC()
	} else if state == driver.StateRunning && b.sb.State != driver.StateRunning {
		b.sb.StartedAt = time.Now().UTC()
	}
	b.sb.State = state
	d.mu.Unlock()
	stopProcs(context.Background(), procs, 0, fmt.Errorf("sandbox %s left running during the command: %w", name, agentproto.ErrProtocol))
	return nil
}

// List returns copies of the sandboxes labelled with installation, sorted by name.
func (d *Driver) List(ctx context.Context, installation string) ([]*driver.Sandbox, error) {
	if err := d.enter(OpList); err != nil {
		return nil, err
	}
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

// ImageEnv returns the ENV lines of image ref (a ref or an ID) given by WithImageEnv; an unknown image is
// NotFound, as the engine's inspect is.
func (d *Driver) ImageEnv(_ context.Context, ref string) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	id, ok := d.images[ref]
	if !ok && d.imageIDs[ref] {
		id, ok = ref, true
	}
	if !ok {
		return nil, fmt.Errorf("inspect image %q: %w", ref, errdefs.ErrNotFound)
	}
	return slices.Clone(d.imageEnv[id]), nil
}
