package sandkeep

import (
	"crypto/x509"
	"log/slog"
	"os"
	"time"

	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/engine"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/homedir"
	"github.com/sandkeep/sandkeep/internal/policy"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/tier"
)

// DefaultImage is the image used when neither Config.Image nor SANDKEEP_IMAGE names one. On a machine with
// no registry, `make image` (scripts/build-image.sh) builds it from busybox-static.
const DefaultImage = engine.DefaultImage

// Config configures a Manager: it is the operator tier. Zero fields take the documented defaults.
type Config struct {
	Home string // state home; default SANDKEEP_HOME, else /var/lib/sandkeep (root) or ~/.local/state/sandkeep
	// SandboxDir, when set, keeps what sandboxes see of the host (workspaces, volumes, channel directories, the
	// agent, per-key uids) and snapshots there instead of in Home: replicas of a fleet on one host with homes of
	// their own set the same one, so one adopts another's containers, workspaces and snapshots.
	SandboxDir string
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
	HostStatePaths []string // host_state auto's candidates ("~/" is HostStateHome); empty: engine.DefaultHostStatePaths
	Repository     RepositoryPolicy
	// HostServices are the operator's host endpoints (name -> http://127.0.0.1:PORT[/path]) a template offers
	// inside its runs' sandboxes (Template.Services) at SANDKEEP_SERVICE_<NAME>_URL, behind the run's bearer
	// token in SANDKEEP_SERVICE_<NAME>_TOKEN (docs/SECURITY.md, "Host services").
	HostServices map[string]string

	// Templates are the operator's sandbox shapes an API caller picks by name; a run that names none gets
	// TenantTemplates[tenant], else DefaultTemplate, else the Config's own shape.
	Templates       map[string]Template
	DefaultTemplate string
	TenantTemplates map[string]string
	// PoolCap bounds the warm pools' members in all (Template.Pool); 0: the sum of the pools.
	PoolCap int
	// SnapshotQuota bounds each tenant's snapshots: how many, and their archives' bytes. Zero fields take the
	// defaults (100 snapshots, 10 GiB); a negative one lifts the bound.
	SnapshotQuota SnapshotQuota
	// SnapshotStore, when its Bucket is set, keeps snapshot archives there (the records are in Store when one is set, else in Home).
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
	// A run's RunRequest.Network is merged with it. NetworkPresets adds the operator's named rule lists to
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

	envErr error // a malformed SANDKEEP_* variable, reported by Open

	egressResolver egress.Resolver // tests: where the egress proxy resolves
	egressRoots    *x509.CertPool  // tests: which upstream roots it trusts
}

// SnapshotQuota bounds one tenant's snapshots (package snapshots): how many, and their archives' bytes.
type SnapshotQuota struct {
	Count int
	Bytes int64
}

// SnapshotStore is an S3-compatible bucket: Endpoint host[:port] (TLS unless Insecure), an object name Prefix;
// empty keys come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
type SnapshotStore struct {
	Endpoint, Bucket, Prefix, Region, AccessKey, SecretKey string
	Insecure                                               bool
}

// Store is where runs, events and API tokens are recorded (package sandkeep/stores opens one).
type Store = store.Store

// RepositoryPolicy is what the operator lets a repository's files (sandkeep.yaml, devcontainer.json) ask for:
// the secrets and credentials they may name, the host paths they may bind, the host variables ${localEnv:...}
// may read, and how wide their network rules may be. Everything else a repository may not set is refused with
// TIER_REFUSED, a diagnostic naming the field and the setting that would allow it.
type RepositoryPolicy = tier.Operator

// Network is where a sandbox may connect to: a mode (none, allowlist, denylist, open), a preset, rules (last match
// wins), credentials injected by the egress proxy, and TLS inspection. On a run's request, Inherit says whether it
// is added to the Config's (append, the default) or replaces it.
type Network struct {
	Mode    string   // none (also ""), allowlist, denylist or open
	Preset  string   // a preset whose rules come before Rules ("default": common registries and source hosts)
	Rules   []string // egress rule syntax; last match wins
	Inherit string   // on a run's block: append (default: added to the Config's block) or replace
	// Credentials are secrets the sandbox only ever sees as a placeholder: the proxy puts the value in for
	// requests to the credential's hosts, and refuses a request to any other host that carries either.
	Credentials []Credential
	// Inspect is TLS inspection: "" or auto (on when there are credentials), on, or off.
	Inspect string
}

// Credential is a secret the sandbox sees only as a placeholder in the environment variable Name; the egress
// proxy puts Value in for requests to Hosts, and refuses any other host a request carrying either. Header (""
// is Authorization) is written with Scheme ("" is Bearer; none, Basic, token, ...); Fields opts other places in
// by name (header:<Name>, form:<field>, json:<member>); plain http:// only with AllowPlaintext.
type Credential struct {
	Name           string
	Value          string
	Hosts          []string
	Header         string
	Scheme         string
	Fields         []string
	AllowPlaintext bool
}

func (n *Network) engine() *engine.Network {
	if n == nil {
		return nil
	}
	out := &engine.Network{Mode: n.Mode, Preset: n.Preset, Rules: n.Rules, Inherit: n.Inherit, Inspect: n.Inspect}
	for _, c := range n.Credentials {
		out.Credentials = append(out.Credentials, engine.Credential(c))
	}
	return out
}

// ConfigFromEnv returns a Config filled from the operator's environment: SANDKEEP_HOME, SANDKEEP_IMAGE,
// SANDKEEP_AGENT, SANDKEEP_GATE_WAIT, SANDKEEP_SANDBOX_DEFAULT, SANDKEEP_SPEC, SANDKEEP_SANDBOX_USER,
// SANDKEEP_SANDBOX_UIDS (a host uid per key, "FIRST-LAST" or "off"), SANDKEEP_RUNTIME (e.g. runsc) and the
// host kind (SANDKEEP_HOST_KIND, else cloud when KUBERNETES_SERVICE_HOST is set). Drivers and the store are
// not chosen here: offer them (package drivers, package stores). A malformed variable is reported by Open.
func ConfigFromEnv() Config {
	c := Config{Home: os.Getenv("SANDKEEP_HOME"), Image: os.Getenv("SANDKEEP_IMAGE"), AgentPath: os.Getenv("SANDKEEP_AGENT"),
		SandboxDefault: os.Getenv(policy.EnvSandboxDefault), Spec: os.Getenv("SANDKEEP_SPEC"),
		User: os.Getenv("SANDKEEP_SANDBOX_USER")}
	c.Runtime, c.SandboxUIDs = os.Getenv("SANDKEEP_RUNTIME"), os.Getenv("SANDKEEP_SANDBOX_UIDS")
	if kind, err := policy.HostKind(os.Getenv); err != nil {
		c.envErr = err
	} else {
		c.HostKind = string(kind)
	}
	if v := os.Getenv("SANDKEEP_GATE_WAIT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			c.envErr = fault.New(fault.InvalidArgument, "write a positive duration with a unit, e.g. SANDKEEP_GATE_WAIT=30s",
				"SANDKEEP_GATE_WAIT=%q is not a duration", v)
		}
		c.GateWait = d
	}
	return c
}

// DefaultHome is where state lives when nothing says otherwise (the CLI's fast path shares it).
func DefaultHome() string { return homedir.Default() }

// engine is c as the engine takes it.
func (c Config) engine() engine.Config {
	e := engine.Config{Home: c.Home, SandboxDir: c.SandboxDir, Image: c.Image, AgentPath: c.AgentPath, User: c.User, AllowRoot: c.AllowRoot,
		PidsLimit: c.PidsLimit, MemoryBytes: c.MemoryBytes, CPUs: c.CPUs, TmpBytes: c.TmpBytes, Env: c.Env,
		Mounts: c.Mounts, Tmpfs: c.Tmpfs, SandboxUIDs: c.SandboxUIDs, Runtime: c.Runtime, DiskBytes: c.DiskBytes,
		DiskInodes: c.DiskInodes, DiskMaxBytes: c.DiskMaxBytes, DiskMaxInodes: c.DiskMaxInodes, GateWait: c.GateWait,
		MaxKeys: c.MaxKeys, IdleTimeout: c.IdleTimeout, NoSweeper: c.NoSweeper, SweepInterval: c.SweepInterval, Retention: c.Retention, RemoveWorkspaceOnRetention: c.RemoveWorkspaceOnRetention,
		Grace: c.Grace, PullTimeout: c.PullTimeout, Transport: c.Transport, HostKind: c.HostKind,
		SandboxDefault: c.SandboxDefault, Spec: c.Spec, HostState: c.HostState, HostStateHome: c.HostStateHome, HostStatePaths: c.HostStatePaths, Repository: c.Repository, HostServices: c.HostServices, DefaultTemplate: c.DefaultTemplate,
		TenantTemplates: c.TenantTemplates, PoolCap: c.PoolCap, SnapshotQuota: engine.SnapshotQuota(c.SnapshotQuota), SnapshotStore: engine.SnapshotStore(c.SnapshotStore), MaxTimeout: c.MaxTimeout, MaxOutputLimit: c.MaxOutputLimit,
		PostCreate: c.PostCreate, SetupTimeout: c.SetupTimeout, Store: c.Store, Network: c.Network.engine(),
		NetworkPresets: c.NetworkPresets, NetworkSilent: c.NetworkSilent, NetworkRefused: c.NetworkRefused,
		OnEvent: engine.EventFunc(c.OnEvent), Logger: c.Logger, EnvErr: c.envErr,
		EgressResolver: c.egressResolver, EgressRoots: c.egressRoots}
	for _, d := range c.Drivers {
		if d != nil {
			e.Drivers = append(e.Drivers, d.Option())
		}
	}
	if c.Templates != nil {
		e.Templates = make(map[string]engine.Template, len(c.Templates))
		for name, t := range c.Templates {
			e.Templates[name] = t.engine()
		}
	}
	return e
}

// Template is an operator-defined sandbox shape that a caller picks by name (RunRequest.Template, the API's and
// MCP's template field). Its fields replace the Config's for the runs that use it; zero fields keep the
// Config's. A sandbox remembers its template: asking for another recycles it.
type Template struct {
	Image       string   // image ref; "" keeps Config.Image
	User        string   // sandbox "uid:gid"
	CPUs        float64  //
	MemoryBytes int64    //
	PidsLimit   int64    //
	Env         []string // added to the Config's, "K=V"
	PostCreate  string
	// Spec is a repository spec (sandkeep.yaml) the template's runs follow when the request names none. It is
	// the repository tier, checked against Config.Repository like any other.
	Spec string
	// Network is added to Config.Network (Inherit: append or replace); its credentials are the operator's values.
	Network *Network
	// Secrets are secret files by the operator's names (Config.Repository.Secrets), delivered to every command.
	Secrets []TemplateSecret
	// Tenants may use the template; empty: every tenant.
	Tenants []string
	// Pool is how many sandboxes of the template a warm pool keeps made ahead (package pools); 0: none.
	Pool int
	// HostState overrides Config.HostState for the template's runs: auto or none ("" keeps the Config's).
	HostState string
	// Services are host services by the operator's names (Config.HostServices) offered to the template's runs.
	Services []string
	// Requests is what each sandbox reserves on its node apart from what it may use; zero fields reserve the limit.
	Requests Requests
	// SuspendAfter is how long one of the template's sandboxes stays idle before the sweeper suspends it: its
	// container (on kubernetes its pod) removed and its workspace kept, so it holds nothing of the node. The key's
	// next command resumes it transparently (sandbox_suspended, sandbox_resumed). 0: never.
	SuspendAfter time.Duration
	// PauseOnRetention: a sandbox past Config.Retention is suspended (workspace kept, resumed by the next
	// command) rather than removed; RemoveWorkspaceOnRetention does not apply.
	PauseOnRetention bool
}

// Requests is what a sandbox reserves: CPUs (cores, e.g. 0.05) and MemoryBytes, each at most its limit. On
// Kubernetes they are the pod's requests, so a node holds as many idle sandboxes as their requests fit.
type Requests struct {
	CPUs        float64
	MemoryBytes int64
}

// TemplateSecret is one secret file of a template: the operator's secret Name at Path (under /run/secrets).
type TemplateSecret struct {
	Name string
	Path string
	Mode string // octal, default "0400"
}

func (t Template) engine() engine.Template {
	e := engine.Template{Image: t.Image, User: t.User, CPUs: t.CPUs, MemoryBytes: t.MemoryBytes, PidsLimit: t.PidsLimit,
		Env: t.Env, PostCreate: t.PostCreate, Spec: t.Spec, Network: t.Network.engine(), Tenants: t.Tenants, Pool: t.Pool,
		Requests: engine.Requests(t.Requests), HostState: t.HostState, Services: t.Services, SuspendAfter: t.SuspendAfter, PauseOnRetention: t.PauseOnRetention}
	for _, s := range t.Secrets {
		e.Secrets = append(e.Secrets, engine.TemplateSecret(s))
	}
	return e
}
