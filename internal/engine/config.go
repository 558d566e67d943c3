package engine

import (
	"crypto/x509"
	"errors"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/homedir"
	"github.com/sandkeep/sandkeep/internal/spec"
	"github.com/sandkeep/sandkeep/internal/store"
)

// DefaultImage is the image used when neither Config.Image nor SANDKEEP_IMAGE names one. On a machine with
// no registry, `make image` (scripts/build-image.sh) builds it from busybox-static.
const DefaultImage = "sandkeep-busybox:latest"

// Config is the operator tier as the engine reads it: sandkeep.Config, field for field (see its documentation).
// Zero fields take the documented defaults.
type Config struct {
	Home       string // state home; default SANDKEEP_HOME, else /var/lib/sandkeep (root) or ~/.local/state/sandkeep
	SandboxDir string // where sandboxes' host side and snapshots live when not in Home (sandkeep.Config.SandboxDir)
	Image      string // default SANDKEEP_IMAGE, else DefaultImage
	AgentPath  string // default SANDKEEP_AGENT, else sandkeep-agent next to the executable, else on PATH

	User        string   // sandbox "uid:gid", default 1000:1000; root is refused unless AllowRoot
	AllowRoot   bool     //
	PidsLimit   int64    // default 512
	MemoryBytes int64    // default 2 GiB (swap equal: no swap)
	CPUs        float64  // default 1
	TmpBytes    int64    // size of the /tmp tmpfs, default 256 MiB
	Env         []string // base environment of every sandbox, "K=V"
	Mounts      []string // extra binds in `--mount` syntax, checked by the mount guard
	Tmpfs       []string // extra tmpfs mounts, "/path[:size=64m,mode=0700,...]" as in sandkeep.yaml
	// SandboxUIDs, "FIRST-LAST" (e.g. "200000-265535"), gives each key's sandbox a host uid of its own from that
	// range instead of User; "" is the default, 200000-265535 for the Docker driver when sandkeep runs as root
	// and User is unset; "off" runs every sandbox as User (docs/SECURITY.md, "Identity"). Runtime is the engine's OCI runtime for sandboxes
	// ("" the engine's default, "runsc" for gVisor).
	SandboxUIDs string
	Runtime     string
	// DiskBytes and DiskInodes bound each workspace with a file system of its own (spec resources.disk and
	// resources.inodes; needs root); zero is none. DiskMaxBytes and DiskMaxInodes are the operator's ceilings.
	DiskBytes, DiskInodes       int64
	DiskMaxBytes, DiskMaxInodes int64

	GateWait time.Duration // bound on waiting for a busy key; default 10m
	// MaxKeys bounds the users this Manager runs or queues commands for at once (past it a new one is
	// KEY_LIMIT) and the per-key state it caches; 0: 65536.
	MaxKeys     int
	IdleTimeout time.Duration // stop a sandbox idle this long; default 30m
	// NoSweeper: Open starts no sweeper. Without it the Manager sweeps its home every SweepInterval (default 1m)
	// from Open to Close, as the home's only sweeper (RunSweeper); the CLI sets it and sweeps where it means to.
	NoSweeper                  bool
	SweepInterval              time.Duration
	Retention                  time.Duration // remove a sandbox stopped this long; default 24h
	RemoveWorkspaceOnRetention bool          // also delete the workspace then; default keep
	Grace                      time.Duration // SIGTERM-to-SIGKILL grace for a command's tree; default 2s
	PullTimeout                time.Duration // bound on an image pull; default 5m

	// Transport is how commands reach the in-sandbox agent: "auto" (the persistent channel when it is up, else
	// Docker exec), "agent" (the channel only) or "exec" (Docker exec only). Default $SANDKEEP_TRANSPORT, else auto.
	Transport string

	// Drivers are what admission may choose from (package sandkeep/drivers; HostDriver for the passthrough); the
	// host kind's preference order ranks them and one probe each says which are usable. None offered: every
	// active mode is refused. HostKind is local (docker, podman, then host) or cloud (kubernetes, then host); ""
	// is local (ConfigFromEnv reads SANDKEEP_HOST_KIND and KUBERNETES_SERVICE_HOST).
	Drivers  []DriverOption
	HostKind string

	// SandboxDefault is the operator's mode for runs that neither ask for one nor get one from their spec: none,
	// auto or inline ("" is auto). ConfigFromEnv reads SANDKEEP_SANDBOX_DEFAULT; it is the "env" source.
	SandboxDefault string
	// Spec is the repository's sandkeep.yaml (with devcontainer.json beside it) that runs follow unless their
	// RunRequest names another; ConfigFromEnv reads SANDKEEP_SPEC. Its files are the repository tier: they may
	// only ask for what Repository allows.
	Spec string
	// HostState gives local developers' sandboxes the operator's own state (operator tier; a repository's is
	// TIER_REFUSED): "auto" binds the git identity and tool caches (HostStatePaths, default Go, npm, pnpm, yarn)
	// at their own paths under a tmpfs HOME at HostStateHome, skipping what is missing or overlaps the workspace
	// (sandbox_host_state_mounted); "none" passes the git identity as GIT_AUTHOR_* and GIT_COMMITTER_*; "" neither.
	// A template's or a request's HostState overrides it. The kubernetes driver refuses auto.
	HostState      string
	HostStateHome  string   // the operator's home; "" is the process's ($HOME)
	HostStatePaths []string // host_state auto's candidates ("~/" is HostStateHome); empty: DefaultHostStatePaths
	Repository     RepositoryPolicy
	// HostServices are the operator's host endpoints (name -> http://127.0.0.1:PORT[/path]) a template may offer
	// inside its runs' sandboxes (Template.Services): at SANDKEEP_SERVICE_<NAME>_URL, behind the run's bearer
	// token in SANDKEEP_SERVICE_<NAME>_TOKEN. At most 16; names [a-z0-9_-].
	HostServices map[string]string

	// Templates are the operator's sandbox shapes an API caller picks by name; a run that names none gets
	// TenantTemplates[tenant], else DefaultTemplate, else the Config's own shape.
	Templates       map[string]Template
	DefaultTemplate string
	TenantTemplates map[string]string
	// PoolCap bounds the warm pools' members in all (Template.Pool); 0: the sum of the pools.
	PoolCap int
	// SnapshotQuota bounds each tenant's snapshots: how many, and their archives' bytes. Zero fields take
	// DefaultSnapshotQuota's; a negative one lifts the bound.
	SnapshotQuota SnapshotQuota
	// SnapshotStore, when its Bucket is set, keeps the snapshots' archives in that S3-compatible bucket instead
	// of the home (the records are in Store when one is set, else in the home).
	SnapshotStore SnapshotStore

	// MaxTimeout and MaxOutputLimit bound what a caller may ask of one command; defaults 24h and 64 MiB.
	MaxTimeout     time.Duration
	MaxOutputLimit int64

	// PostCreate runs once (sh -c) in every newly created sandbox before its first command; a failure removes
	// the sandbox again (POST_CREATE_FAILED). SetupTimeout bounds providing a sandbox (pull, create, start,
	// post-create): past it SANDBOX_SETUP_TIMEOUT. Defaults: none, 15m.
	PostCreate   string
	SetupTimeout time.Duration

	// Store, when set, records every run and its events (package sandkeep/stores opens SQLite or PostgreSQL;
	// the CLI's default is <home>/sandkeep.db). The caller owns it and closes it after the Manager. Nil: nothing
	// is recorded; OnEvent still reports.
	Store Store

	// Network is where every command may connect to (see docs/SECURITY.md, "Egress"); nil is mode none: nowhere.
	// A command's ExecRequest.Network is merged with it. NetworkPresets adds the operator's named rule lists to
	// the built-in "default" (or replaces it under that name); NetworkSilent lists hosts (rules) refused without a
	// network_blocked event, e.g. telemetry endpoints.
	Network        *Network
	NetworkPresets map[string][]string
	NetworkSilent  []string
	// NetworkRefused lists address ranges (CIDRs) refused like private ones unless a command's IP rule names
	// them: the host's own public NAT address, a provider's host endpoints.
	NetworkRefused []string

	// OnEvent receives the events that belong to no command (the sweeper's stops and removals); may be nil.
	OnEvent EventFunc

	Logger *slog.Logger

	// EnvErr is a malformed SANDKEEP_* variable ConfigFromEnv met, reported by Open.
	EnvErr error

	// EgressResolver and EgressRoots are the tests' "internet": where the egress proxy resolves and which upstream
	// roots it trusts (nil: the system's).
	EgressResolver egress.Resolver
	EgressRoots    *x509.CertPool
}

// Network is where a sandbox may connect to: a mode (none, allowlist, denylist, open), a preset, rules (last match
// wins), credentials injected by the egress proxy, and TLS inspection. On a command, Inherit says whether it is
// added to the Config's (append, the default) or replaces it.
type Network = lifecycle.Network

// Credential is a secret the sandbox sees only as a placeholder in the environment variable Name; the egress
// proxy puts Value in for requests to Hosts, and refuses any other host a request carrying either.
type Credential = lifecycle.Credential

// Store is where runs, events and API tokens are recorded (package sandkeep/stores opens one).
type Store = store.Store

// DefaultHome is where state lives when nothing says otherwise (internal/homedir: the CLI's fast path shares it).
func DefaultHome() string { return homedir.Default() }

func (c *Config) lifecycle() (lifecycle.Config, error) {
	if c.EnvErr != nil {
		return lifecycle.Config{}, c.EnvErr
	}
	if c.MaxTimeout <= 0 || c.MaxTimeout > lifecycle.MaxTimeout {
		c.MaxTimeout = lifecycle.MaxTimeout
	}
	if c.MaxOutputLimit <= 0 || c.MaxOutputLimit > agentproto.MaxOutputLimit {
		c.MaxOutputLimit = agentproto.MaxOutputLimit
	}
	if c.Home == "" {
		c.Home = DefaultHome()
	}
	if c.Image == "" {
		c.Image = DefaultImage
	}
	if c.Transport == "" {
		c.Transport = os.Getenv("SANDKEEP_TRANSPORT")
	}
	transport, err := lifecycle.ParseTransport(c.Transport)
	if err != nil {
		return lifecycle.Config{}, err
	}
	agent, err := findAgent(c.AgentPath)
	if err != nil {
		return lifecycle.Config{}, err
	}
	mounts, err := parseMounts(c.Mounts)
	if err != nil {
		return lifecycle.Config{}, err
	}
	uids, err := lifecycle.ParseUIDRange(c.SandboxUIDs)
	if err != nil {
		return lifecycle.Config{}, err
	}
	refused, err := parseRefused(c.NetworkRefused)
	if err != nil {
		return lifecycle.Config{}, err
	}
	services, err := hostServices(c.HostServices)
	if err != nil {
		return lifecycle.Config{}, err
	}
	tmpfs := map[string]string{}
	for _, t := range c.Tmpfs {
		target, opts, _ := strings.Cut(t, ":")
		tmpfs[target] = opts
	}
	if list := (spec.Sandbox{Tmpfs: c.Tmpfs}).Validate(); list.HasErrors() {
		return lifecycle.Config{}, fault.New(fault.InvalidMount, "write /path[:size=64m,mode=0755]", "%s", list[0].Message)
	}
	return lifecycle.Config{
		Image: c.Image, AgentPath: agent, User: c.User, AllowRoot: c.AllowRoot,
		PidsLimit: c.PidsLimit, MemoryBytes: c.MemoryBytes, NanoCPUs: int64(c.CPUs * 1e9), TmpBytes: c.TmpBytes,
		Env: c.Env, Mounts: mounts, Tmpfs: tmpfs, UIDs: uids, Runtime: c.Runtime,
		DiskBytes: c.DiskBytes, DiskInodes: c.DiskInodes, DiskMaxBytes: c.DiskMaxBytes, DiskMaxInodes: c.DiskMaxInodes,
		GateWait: c.GateWait, MaxKeys: c.MaxKeys, IdleTimeout: c.IdleTimeout, Retention: c.Retention,
		RemoveWorkspace: c.RemoveWorkspaceOnRetention, Grace: c.Grace, Logger: logger(c.Logger),
		Transport: transport, OnEvent: lifecycle.Sink(c.OnEvent),
		PostCreate: c.PostCreate, SetupTimeout: c.SetupTimeout,
		EgressResolver: c.EgressResolver, EgressUpstreamRoots: c.EgressRoots, EgressRefused: refused,
		HostServices: services,
		SuspendAfter: c.suspendAfter(), PauseOnRetention: c.pauseOnRetention(),
	}, nil
}

// pauseOnRetention names the templates whose sandboxes are suspended rather than removed past retention; nil
// when none is.
func (c Config) pauseOnRetention() map[string]bool {
	var out map[string]bool
	for name, t := range c.Templates {
		if t.PauseOnRetention {
			if out == nil {
				out = map[string]bool{}
			}
			out[name] = true
		}
	}
	return out
}

// suspendAfter is each template's SuspendAfter, for the sweeper; nil when no template suspends.
func (c Config) suspendAfter() map[string]time.Duration {
	var out map[string]time.Duration
	for name, t := range c.Templates {
		if t.SuspendAfter > 0 {
			if out == nil {
				out = map[string]time.Duration{}
			}
			out[name] = t.SuspendAfter
		}
	}
	return out
}

// parseRefused reads Config.NetworkRefused.
func parseRefused(in []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range in {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fault.New(fault.NetworkInvalid, "write an address range such as 203.0.113.7/32 or 2001:db8::/48",
					"refused network range %q is not a CIDR", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// findAgent locates the static agent binary: the configured path, else next to this executable, else PATH.
func findAgent(configured string) (string, error) {
	const hint = "build it with `make build` (bin/sandkeep-agent) or set SANDKEEP_AGENT to its path"
	if configured != "" {
		if _, err := os.Stat(configured); err != nil {
			return "", fault.Wrap(err, fault.AgentMissing, hint, "the agent binary %s cannot be read", configured)
		}
		return configured, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "sandkeep-agent")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", fault.Wrap(err, fault.AgentMissing, hint, "the agent binary %s cannot be read", p)
		}
	}
	if p, err := exec.LookPath("sandkeep-agent"); err == nil {
		return p, nil
	}
	return "", fault.New(fault.AgentMissing, hint, "the sandkeep-agent binary was not found next to sandkeep or on PATH")
}

// CheckAgent reports whether the agent binary sandkeep would use (configured, else found) is there.
func CheckAgent(configured string) error {
	_, err := findAgent(configured)
	return err
}

// SandboxUIDs is the per-key uid range sandboxes on the Docker driver run under, given the operator's
// SandboxUIDs and User: eff as FIRST-LAST, or "" with why it is off (doctor shows both). A malformed range is
// its error.
func SandboxUIDs(uids, user string) (eff, why string, err error) {
	r, err := lifecycle.ParseUIDRange(uids)
	if err != nil {
		return "", "", err
	}
	e, why := lifecycle.EffectiveUIDs(r, user, "docker")
	return e.String(), why, nil
}
