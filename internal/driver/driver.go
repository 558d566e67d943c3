// Package driver is the contract between sandkeep's lifecycle and whatever makes sandboxes (Docker, later
// Kubernetes and the host passthrough). A driver offers primitives: inspect, create, start, stop, remove, list,
// exec. Deciding when to reuse, start or recreate a sandbox is the lifecycle's job, in one place for all drivers.
package driver

import (
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/channel"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Driver makes and runs sandboxes. It is safe for concurrent use. Every method honours ctx.
//
// Errors are classified with github.com/containerd/errdefs: Inspect of an absent sandbox is ErrNotFound; Create
// of a name that is taken is ErrConflict; Start of an absent sandbox is ErrNotFound and of a running one nil;
// Stop and Remove of a sandbox that is already gone return nil.
//
// A *Sandbox is addressed by its ID: an old value never reaches a newer sandbox that took the same name.
// Sandbox.Labels may hold labels the engine added (e.g. the image's); check the ones you need, never the map.
//
// Exec errors: a sandbox that is not running is ErrConflict, an absent one ErrNotFound (in both cases nothing
// ran, so the caller may ensure and retry); a cancelled ctx returns the partial Result with Cancelled set and
// an error wrapping ctx's cause, only once the command's process tree is gone; a channel that broke (garbage,
// a cut stream, the sandbox stopped or removed mid-command) is an error wrapping agentproto.ErrProtocol.
// No descendant of a command outlives it: the agent kills what is left when the command exits.
type Driver interface {
	// Name is the driver's name: "docker", "kubernetes", "host", "fake".
	Name() string
	Capabilities() Capabilities
	// Ping talks to the engine; nil means it answered.
	Ping(ctx context.Context) error
	// ResolveImage returns the ID of the image ref, pulling it when absent. A ref that cannot be had is a
	// *fault.Error with code IMAGE_UNAVAILABLE.
	ResolveImage(ctx context.Context, ref string) (imageID string, err error)
	// Inspect returns the sandbox with this container name, ours or not (see Sandbox.Labels).
	Inspect(ctx context.Context, name string) (*Sandbox, error)
	// Create makes (but does not start) a sandbox for spec.
	Create(ctx context.Context, spec *CreateSpec) (*Sandbox, error)
	Start(ctx context.Context, sb *Sandbox) error
	// Stop stops the sandbox, giving its processes grace before they are killed.
	Stop(ctx context.Context, sb *Sandbox, grace time.Duration) error
	// Remove deletes the sandbox (forcefully, if running). Its workspace on the host is not touched.
	Remove(ctx context.Context, sb *Sandbox) error
	// List returns every sandbox labelled with this installation id.
	List(ctx context.Context, installation string) ([]*Sandbox, error)
	// Exec runs one command through the agent inside a running sandbox and streams its output to out.
	// A returned error wrapping agentproto.ErrProtocol means the channel broke and the sandbox should recycle.
	Exec(ctx context.Context, sb *Sandbox, req agentproto.Request, out Output) (agentproto.Result, error)
}

// PortDialer is optional: a driver that can open a TCP connection to a port on a running sandbox's own loopback,
// from inside the sandbox's network namespace, without giving the sandbox any network (port forwarding).
type PortDialer interface {
	// DialPort connects to 127.0.0.1:port inside sb. Nothing listening there is ErrPortUnreachable. The
	// connection ends when either side closes it or the sandbox stops.
	DialPort(ctx context.Context, sb *Sandbox, port int) (net.Conn, error)
}

// AgentRelayer is optional: a driver that can carry a session of a sandbox's agent channel through its engine's
// exec (a relay, cmd/sandkeep-agent/relay_linux.go), for sandboxes whose agent cannot reach a host socket
// (gVisor) or whose process uses the exec transport. The session speaks the same multiplexed wire as a channel.
type AgentRelayer interface {
	// Relay opens one session; an agent that turns it away (another session is up) is ErrRelayRefused.
	Relay(ctx context.Context, sb *Sandbox) (net.Conn, error)
}

// ErrRelayRefused means the sandbox's agent did not take a relay's session.
var ErrRelayRefused = errors.New("the sandbox's agent did not take the relay's session")

// ErrPortUnreachable means nothing accepted a connection on the sandbox's port.
var ErrPortUnreachable = errors.New("nothing accepts connections on that port in the sandbox")

// PostureHasher is optional: a driver that applies only part of a Posture hashes that part, so that what it does
// not apply (the host paths of its mounts, on a driver that binds none) never recycles a sandbox. Replicas of a
// fleet with their own state homes then agree on a sandbox's posture.
type PostureHasher interface {
	PostureHash(p Posture) string
}

// WorkspaceRemover is optional: a driver that keeps a sandbox's workspace itself (a Kubernetes claim) removes it
// when the sandbox is removed without keeping its workspace. An absent workspace is not an error.
type WorkspaceRemover interface {
	RemoveWorkspace(ctx context.Context, name string) error
}

// ClaimKeeper is optional: a driver whose sandboxes are shared by processes with state homes of their own (the
// replicas of a fleet on one cluster) keeps warm pool claims on the member's own record, where every process
// sees them, and makes each claim one atomic step of the engine's, so that one member is never handed to two
// keys. A sandbox it reports carries its claim in LabelClaimedBy, LabelClaimTenant and LabelClaimUser.
type ClaimKeeper interface {
	// Claim marks the pool member sb as the key's that c names, or (c.Key "") as drained, so that nobody claims
	// it any more. A member some process claimed or drained first is ErrConflict; an absent one ErrNotFound.
	Claim(ctx context.Context, sb *Sandbox, c Claim) error
	// Claimed returns the sandbox of this installation claimed by the key with hex keyHex, or ErrNotFound.
	Claimed(ctx context.Context, installation, keyHex string) (*Sandbox, error)
	// Exists reports whether a sandbox named name, or a workspace of such a sandbox, exists: a key whose own
	// sandbox name has either is not new, whatever this process's home says.
	Exists(ctx context.Context, name string) (bool, error)
}

// Claim is a warm pool member's claim: the key (its hex, tenant and user) it is now the sandbox of.
type Claim struct {
	Key    string `json:"key"`
	Tenant string `json:"tenant"`
	User   string `json:"user"`
}

// ClaimOf is the claim a ClaimKeeper reported on sb, if any (Key "" with ok: drained).
func ClaimOf(sb *Sandbox) (Claim, bool) {
	k, ok := sb.Labels[LabelClaimedBy]
	if !ok {
		return Claim{}, false
	}
	return Claim{Key: k, Tenant: sb.Labels[LabelClaimTenant], User: sb.Labels[LabelClaimUser]}, true
}

// EgressListener is optional: a driver whose sandboxes reach sandkeep over a network rather than through a bound
// host directory (a Kubernetes pod) serves their egress itself. ListenEgress returns a listener whose connections
// come only from sb's agent (the driver authenticated them); the lifecycle serves sb's egress proxy on it, as it
// does on the channel directory's socket for Docker. Close stops it. A driver that cannot confine sb's network to
// that listener (NetworkPolicy not enforced) refuses with a typed error: the command must not run.
type EgressListener interface {
	ListenEgress(ctx context.Context, sb *Sandbox) (net.Listener, error)
}

// NetworkPolicyProber is optional: a driver whose network confinement rests on something it does not run (a
// cluster's network plugin, which may accept NetworkPolicy objects and enforce nothing) proves it with a probe.
// Capabilities().NetworkPolicy is true only once a probe proved it; detail says what the probe found, for doctor.
type NetworkPolicyProber interface {
	ProbeNetworkPolicy(ctx context.Context) (enforced bool, detail string)
}

// CapacityReporter is optional: a driver says how much its sandboxes can reserve in all (a cluster's schedulable
// nodes' allocatable, a namespace quota's requests, a Docker host's CPUs and memory), for doctor's "capacity"
// check, which divides it by each shape's requests.
type CapacityReporter interface {
	Capacity(ctx context.Context) (Capacity, error)
}

// Capacity is what sandboxes can reserve in all: MilliCPUs and MemoryBytes (zero: unbounded or unknown), over
// Nodes nodes, and Source, where the figures come from in words.
type Capacity struct {
	Nodes       int
	MilliCPUs   int64
	MemoryBytes int64
	Source      string
}

// StatsReporter is optional: a driver that reads a running sandbox's resource use from its engine (Docker's
// container stats). A sandbox that is not running is ErrConflict, as for Exec.
type StatsReporter interface {
	Stats(ctx context.Context, sb *Sandbox) (Stats, error)
}

// Stats is one sample of a sandbox's resource use as its engine counts it. CPUTime is cumulative since the
// sandbox started; CPUs is what it may use (its limit, else the host's online CPUs); MemoryLimit is its limit,
// else the host's memory; MemoryCache is the page cache counted in its memory (not in MemoryUsed).
type Stats struct {
	At          time.Time
	CPUTime     time.Duration
	CPUs        float64
	MemoryUsed  int64
	MemoryLimit int64
	MemoryCache int64
	// DiskUsed and DiskTotal: the workspace's file system where the driver keeps the workspace itself and
	// measures it (the kubernetes driver's claim); zero otherwise.
	DiskUsed, DiskTotal int64
}

// NoNetworkChecker is optional: a driver whose network "none" rests on enforcement it has to prove (the
// kubernetes driver: a NetworkPolicy the cluster's plugin may not enforce) says whether a command that asked for
// network none may run in sb. It returns nil where sb has no network, and an error (NETWORK_UNENFORCED, with the
// fix) where it would in fact have one, unless the operator accepted that.
type NoNetworkChecker interface {
	CheckNoNetwork(ctx context.Context, sb *Sandbox) error
}

// ImageWatcher is optional: a driver that reports image changes lets the lifecycle keep resolved image IDs
// instead of asking the engine before every command.
type ImageWatcher interface {
	// WatchImages calls changed for every image event (tag, untag, delete, pull, load, ...) from since on,
	// until ctx ends (it then returns nil) or the stream fails (it returns why).
	WatchImages(ctx context.Context, since time.Time, changed func()) error
}

// Capabilities are the optional things a driver can do; the policy layer reads them.
type Capabilities struct {
	Build         bool // can build images from a Dockerfile
	HostBinds     bool // can bind host paths into a sandbox
	NetworkPolicy bool // can enforce per-sandbox network policy
	Persistent    bool // sandboxes survive between commands
	// Channel: sandboxes see a host directory bound into them, so the agent can dial a host socket and
	// commands can skip the engine's exec (internal/channel).
	Channel bool
	// Pools: a sandbox made ahead can become any key's without being recreated (warm pools): nothing it was
	// created with names a key; its workspace and channel directory are host files the lifecycle maps to the key
	// (the claim record), or (a ClaimKeeper) objects named after the sandbox that the claim leaves as they are.
	Pools bool
}

// Output receives a command's streams as they are produced. Either may be nil (discard).
type Output struct {
	Stdout io.Writer
	Stderr io.Writer
	Stdin  io.Reader // nil: the command's stdin is /dev/null. Exec may return before a blocked Read does.
	// Resize carries a TTY command's window size changes (agentproto.RunOptions.Resize); nil: none.
	Resize <-chan agentproto.WindowSize
}

// AgentChannels is optional: a driver whose sandboxes' agents connect to the driver itself (the kubernetes
// driver: over the pod network, verified by a per-pod token) offers each sandbox's channel as a channel.Slot,
// the same session side the Docker driver's Unix socket channel installs into. The driver only accepts and
// verifies connections; the lifecycle alone decides whether a command goes over the channel or through Exec.
type AgentChannels interface {
	// HasAgentChannel reports whether the driver serves its sandboxes' channels at all (it may be configured
	// without).
	HasAgentChannel() bool
	// AgentChannel returns sb's channel, or nil when the driver serves none (Exec is then the only way in).
	AgentChannel(sb *Sandbox) *channel.Slot
}

// AgentAnnouncer is optional: a driver whose sandboxes' agents dial an address (the kubernetes driver's pod
// network) tells a running sandbox's agent to dial this process instead, when this process takes on a sandbox
// another made (in a fleet: a replica that took the key over from a dead one). It reports whether it told the
// agent anything; the agent then connects within moments, so a command may wait for the channel a little.
type AgentAnnouncer interface {
	AnnounceChannel(ctx context.Context, sb *Sandbox) (bool, error)
}

// State is a sandbox's engine state, normalised across drivers.
type State string

// States.
const (
	StateRunning    State = "running"
	StateStopped    State = "stopped" // created or exited: can be started
	StatePaused     State = "paused"
	StateRestarting State = "restarting"
	StateDead       State = "dead"
	StateRemoving   State = "removing"
)

// Label keys set on every sandbox sandkeep creates.
const (
	LabelPrefix       = "io.sandkeep."
	LabelTenant       = LabelPrefix + "tenant"
	LabelUser         = LabelPrefix + "user"
	LabelKey          = LabelPrefix + "key"
	LabelImage        = LabelPrefix + "image"    // the image ref as asked for
	LabelImageID      = LabelPrefix + "image-id" // the image ID it resolved to at creation
	LabelPosture      = LabelPrefix + "posture"  // Posture.Hash()
	LabelInstallation = LabelPrefix + "installation"
	LabelCreatedAt    = LabelPrefix + "created-at" // RFC 3339, UTC
	LabelTemplate     = LabelPrefix + "template"   // the operator template the sandbox was made for; absent for none
	// LabelPool is set on a sandbox a template's warm pool made (its value: the template), claimed or not. Its
	// identity labels are the pool member's; a claimed one belongs to the key its claim record names.
	LabelPool = LabelPrefix + "pool"
	// LabelClaimedBy, LabelClaimTenant and LabelClaimUser are a ClaimKeeper's report of a member's claim (never
	// set at create): the claiming key's hex ("" once drained), tenant and user.
	LabelClaimedBy   = LabelPrefix + "claimed-by"
	LabelClaimTenant = LabelPrefix + "claimed-tenant"
	LabelClaimUser   = LabelPrefix + "claimed-user"
)

// Sandbox is what a driver knows of one sandbox.
type Sandbox struct {
	ID         string
	Name       string
	State      State
	Labels     map[string]string
	ImageID    string    // the image the container actually runs
	Pid        int       // the sandbox's init process as the host sees it; 0 when not running or unknown
	StartedAt  time.Time // zero when never started
	FinishedAt time.Time // zero when never stopped
}

// Clone returns a copy that shares nothing with sb.
func (sb *Sandbox) Clone() *Sandbox {
	c := *sb
	c.Labels = maps.Clone(sb.Labels)
	return &c
}

// CreateSpec is everything a driver needs to create one sandbox. The lifecycle builds it; the posture is hashed
// into Labels[LabelPosture] from the very value that is applied.
type CreateSpec struct {
	Key     identity.Key
	Name    string
	Image   string // the image ref
	ImageID string // its resolved ID; the driver creates from this ID so a retag cannot race
	Posture Posture
	Labels  map[string]string
	// Claim, for a ClaimKeeper, makes the sandbox a claimed one from its creation: a key's sandbox recreated
	// under the name of the pool member it claimed (whose workspace it keeps).
	Claim *Claim
}
