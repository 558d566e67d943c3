package main

import (
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/api"
	"github.com/sandkeep/sandkeep/internal/bytesize"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/spec"
	"github.com/sandkeep/sandkeep/internal/tier"
)

// serverConfig is sandkeep-server.yaml: what an operator sets for `sandkeep serve`. Flags override the fields
// they name. Unknown fields are errors, as in the spec.
type serverConfig struct {
	Listen string `yaml:"listen"`
	TLS    struct {
		Cert string `yaml:"cert"`
		Key  string `yaml:"key"`
	} `yaml:"tls"`
	Store string `yaml:"store"`
	// Spec is the sandkeep.yaml every tenant's sandboxes follow: image, user, env, mounts, resources, network.
	Spec string `yaml:"spec"`
	// ShutdownGrace bounds how long SIGTERM waits for running commands (default 30s).
	ShutdownGrace string `yaml:"shutdown_grace"`
	// Sweep: how often the server's sweeper runs (default 1m; "0" turns it off), and the idle time after which
	// a sandbox is stopped and the age after which a stopped one is removed (the library's defaults: 30m, 24h).
	Sweep struct {
		Interval    string `yaml:"interval"`
		IdleTimeout string `yaml:"idle_timeout"`
		Retention   string `yaml:"retention"`
	} `yaml:"sweep"`
	// MetricsTokenEnv names the environment variable holding the bearer token /metrics requires; empty: no auth.
	MetricsTokenEnv string `yaml:"metrics_token_env"`
	// OperatorTokenEnv names the environment variable holding the installation operator's dashboard credential:
	// signed in with it, /ui/ shows every tenant. No tenant's token, admin or not, sees past its tenant.
	OperatorTokenEnv string `yaml:"operator_token_env"`
	// MetricsOpen serves /metrics without auth when there is no metrics token; false: /metrics is refused then.
	MetricsOpen bool `yaml:"metrics_open"`
	// E2B is the E2B front's (docs/E2B.md): the longest timeout a sandbox may ask for (default 24h).
	E2B struct {
		MaxTimeout string `yaml:"max_timeout"`
	} `yaml:"e2b"`
	// Limits bound every tenant; Tenants replaces them for the tenants it names.
	Limits  limitsConfig            `yaml:"limits"`
	Tenants map[string]limitsConfig `yaml:"tenants"`
	// Request and file bounds, as sizes ("1m", "4g").
	MaxBody string `yaml:"max_body"`
	Files   struct {
		MaxFile       string `yaml:"max_file"`
		MaxTar        string `yaml:"max_tar"`
		MaxTarEntries int    `yaml:"max_tar_entries"`
	} `yaml:"files"`
	// Network: the operator's presets (named rule lists) and the hosts refused without an event.
	Network struct {
		Presets map[string][]string `yaml:"presets"`
		Silent  []string            `yaml:"silent"`
		Refused []string            `yaml:"refused"` // CIDRs refused like private ranges unless an IP rule names them
	} `yaml:"network"`
	// HostPassthrough lets the server run a command on the host when a run degrades (mode auto, no engine) or
	// asks for mode none: only as User ("uid:gid", never 0), which owns the workspaces it is given. Unset (the
	// default): the server offers no host passthrough, and such runs are refused (SANDBOX_DRIVER_UNAVAILABLE).
	HostPassthrough struct {
		User string `yaml:"user"`
	} `yaml:"host_passthrough"`
	// Operator is what a repository's files may ask for: the secrets and credentials they may name (with the
	// operator's sources), the host paths they may bind, the host variables ${localEnv:...} may read.
	tier.Operator `yaml:",inline"`
	// Templates are the sandbox shapes API and MCP callers pick by name; DefaultTemplate and TenantTemplates
	// name what a run that picks none gets.
	Templates       map[string]templateConfig `yaml:"templates"`
	DefaultTemplate string                    `yaml:"default_template"`
	TenantTemplates map[string]string         `yaml:"tenant_templates"`
	// PoolCap bounds the templates' warm pools' members in all (0: the sum of their pool sizes).
	PoolCap int `yaml:"pool_cap"`
	// HostState (auto or none) gives sandboxes the operator's git identity and tool caches (sandkeep.Config's
	// HostState); HostStatePaths replaces auto's candidates ("~/" is the operator's home).
	HostState      string   `yaml:"host_state"`
	HostStatePaths []string `yaml:"host_state_paths"`
	// HostServices are host endpoints templates may offer inside their runs' sandboxes (`services: [NAME]`),
	// behind a per-run bearer token: `host_services: {mcp: {url: http://127.0.0.1:8931}}`.
	HostServices map[string]struct {
		URL string `yaml:"url"`
	} `yaml:"host_services"`
	// SnapshotQuota bounds each tenant's snapshots (0: the default, 100 snapshots and 10 GiB; -1: no bound).
	SnapshotQuota struct {
		Count int   `yaml:"count"`
		Bytes int64 `yaml:"bytes"`
	} `yaml:"snapshot_quota"`
	// SnapshotStore keeps snapshot archives in an S3-compatible bucket (records are in the run store; a fleet needs it, or fleet.sandbox_dir):
	// `snapshot_store: {endpoint: s3.example:9000, bucket: snaps, prefix: site-a/, region: us-east-1}`; the keys
	// come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in serve's environment unless given here.
	SnapshotStore struct {
		Endpoint  string `yaml:"endpoint"`
		Bucket    string `yaml:"bucket"`
		Prefix    string `yaml:"prefix"`
		Region    string `yaml:"region"`
		AccessKey string `yaml:"access_key"`
		SecretKey string `yaml:"secret_key"`
		Insecure  bool   `yaml:"insecure"`
	} `yaml:"snapshot_store"`
	// Fleet makes this server one replica of several over one store (servefleet.go).
	Fleet fleetConfig `yaml:"fleet"`
}

// templateConfig is one template of the server config.
type templateConfig struct {
	Image      string            `yaml:"image"`
	User       string            `yaml:"user"`
	CPUs       float64           `yaml:"cpus"`
	Memory     string            `yaml:"memory"`
	Pids       int64             `yaml:"pids"`
	Env        map[string]string `yaml:"env"`
	PostCreate string            `yaml:"post_create"`
	Spec       string            `yaml:"spec"`
	Tenants    []string          `yaml:"tenants"`
	Pool       int               `yaml:"pool"`       // sandboxes kept made ahead for new keys (a warm pool)
	HostState  string            `yaml:"host_state"` // auto or none, over the config's
	Services   []string          `yaml:"services"`   // host services (host_services) offered to its runs
	// SuspendAfter: an idle sandbox of the template is suspended after this long (pod or container removed,
	// workspace kept; the next command resumes it), e.g. 10m.
	SuspendAfter string `yaml:"suspend_after"`
	// PauseOnRetention: a sandbox of the template whose time runs out (stopped past retention) is suspended
	// (workspace kept, resumed by the next command) rather than removed.
	PauseOnRetention bool `yaml:"pause_on_retention"`
	// Requests is what each sandbox reserves apart from its limits (cpus, memory): `requests: {cpus: 0.05,
	// memory: 128m}` packs idle sandboxes densely on a Kubernetes node.
	Requests struct {
		CPUs   float64 `yaml:"cpus"`
		Memory string  `yaml:"memory"`
	} `yaml:"requests"`
	Network *struct {
		Mode        string   `yaml:"mode"`
		Preset      string   `yaml:"preset"`
		Rules       []string `yaml:"rules"`
		Inspect     string   `yaml:"inspect"`
		Credentials []string `yaml:"credentials"` // names of the operator's credentials
	} `yaml:"network"`
	Secrets []struct {
		Name string `yaml:"name"`
		Path string `yaml:"path"`
		Mode string `yaml:"mode"`
	} `yaml:"secrets"`
}

// templates turns the config's templates into the library's, reading each credential's value from the
// operator's source (never from a repository).
func (c serverConfig) templates() (map[string]sandkeep.Template, error) {
	if len(c.Templates) == 0 {
		return nil, nil
	}
	out := make(map[string]sandkeep.Template, len(c.Templates))
	for name, tc := range c.Templates {
		t := sandkeep.Template{Image: tc.Image, User: tc.User, CPUs: tc.CPUs, PidsLimit: tc.Pids, PostCreate: tc.PostCreate,
			Spec: tc.Spec, Tenants: tc.Tenants, Pool: tc.Pool, HostState: tc.HostState, Services: tc.Services}
		if tc.Memory != "" {
			n, err := bytesize.Parse(tc.Memory)
			if err != nil {
				return nil, fault.Wrap(err, fault.InvalidArgument, "write a size such as 512m or 2Gi", "template %s: memory: %v", name, err)
			}
			t.MemoryBytes = n
		}
		if tc.SuspendAfter != "" {
			d, err := time.ParseDuration(tc.SuspendAfter)
			if err != nil || d <= 0 {
				return nil, fault.New(fault.InvalidArgument, "write a duration such as 10m or 1h",
					"template %s: suspend_after %q is not a positive duration", name, tc.SuspendAfter)
			}
			t.SuspendAfter = d
		}
		t.PauseOnRetention = tc.PauseOnRetention
		t.Requests.CPUs = tc.Requests.CPUs
		if tc.Requests.Memory != "" {
			n, err := bytesize.Parse(tc.Requests.Memory)
			if err != nil {
				return nil, fault.Wrap(err, fault.InvalidArgument, "write a size such as 128m or 1Gi", "template %s: requests.memory: %v", name, err)
			}
			t.Requests.MemoryBytes = n
		}
		for _, k := range slices.Sorted(maps.Keys(tc.Env)) {
			t.Env = append(t.Env, k+"="+tc.Env[k])
		}
		for _, s := range tc.Secrets {
			t.Secrets = append(t.Secrets, sandkeep.TemplateSecret{Name: s.Name, Path: s.Path, Mode: s.Mode})
		}
		if n := tc.Network; n != nil {
			t.Network = &sandkeep.Network{Mode: n.Mode, Preset: n.Preset, Rules: n.Rules, Inspect: n.Inspect}
			refs := make([]spec.NetworkCredential, 0, len(n.Credentials))
			for _, cn := range n.Credentials {
				refs = append(refs, spec.NetworkCredential{Name: cn})
			}
			creds, err := c.Operator.ResolveCredentials(refs)
			if err != nil {
				return nil, err
			}
			for _, cr := range creds {
				t.Network.Credentials = append(t.Network.Credentials, sandkeep.Credential{Name: cr.Name, Value: cr.Value,
					Hosts: cr.Hosts, Header: cr.Header, Scheme: cr.Scheme, Fields: cr.Fields, AllowPlaintext: cr.AllowPlaintext})
			}
		}
		out[name] = t
	}
	return out, nil
}

// limitsConfig is api.Limits in the file: an omitted field takes api.DefaultLimits, -1 lifts the bound.
type limitsConfig struct {
	MaxSandboxes         int     `yaml:"max_sandboxes"`
	MaxConcurrentExecs   int     `yaml:"max_concurrent_execs"`
	RequestsPerSecond    float64 `yaml:"requests_per_second"`
	Burst                int     `yaml:"burst"`
	MaxConcurrentFileOps int     `yaml:"max_concurrent_file_ops"`
}

func (l limitsConfig) api() api.Limits {
	return api.Limits{MaxSandboxes: l.MaxSandboxes, MaxConcurrentExecs: l.MaxConcurrentExecs,
		RequestsPerSecond: l.RequestsPerSecond, Burst: l.Burst, MaxConcurrentFileOps: l.MaxConcurrentFileOps}
}

// envConfig names the operator's configuration file (sandkeep-server.yaml). sandkeep serve reads all of it;
// sandkeep exec reads its network block (the operator's presets and silent list).
const envConfig = "SANDKEEP_CONFIG"

// loadServerConfig reads path ("" is the zero config) strictly (tier.DecodeOperator), then checks its values.
func loadServerConfig(path string) (serverConfig, error) {
	var c serverConfig
	if path == "" {
		return c, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fault.Wrap(err, fault.InvalidArgument, "check the --config path", "cannot read the server config %s", path)
	}
	// The operator tier's strict decoding (aliases, duplicate keys, unknown fields, several documents refused
	// with their line), for serve --config and every process that reads $SANDKEEP_CONFIG (the CLI, the daemon).
	if err := tier.DecodeOperator(data, &c); err != nil {
		return serverConfig{}, fault.Wrap(err, fault.InvalidArgument, "see docs/API.md, \"Server configuration\", for the fields",
			"server config %s: %v", path, err)
	}
	return c, c.check(path)
}

// check validates what decoding cannot: sizes, durations, limits.
func (c serverConfig) check(path string) error {
	bad := func(format string, args ...any) error {
		return fault.New(fault.InvalidArgument, "see docs/API.md, \"Server configuration\"", "server config %s: "+format, append([]any{path}, args...)...)
	}
	for name, v := range map[string]string{"max_body": c.MaxBody, "files.max_file": c.Files.MaxFile, "files.max_tar": c.Files.MaxTar} {
		if v == "" {
			continue
		}
		if _, err := bytesize.Parse(v); err != nil {
			return bad("%s: %v", name, err)
		}
	}
	for name, v := range map[string]string{"shutdown_grace": c.ShutdownGrace, "sweep.interval": c.Sweep.Interval,
		"sweep.idle_timeout": c.Sweep.IdleTimeout, "sweep.retention": c.Sweep.Retention} {
		if v == "" {
			continue
		}
		if d, err := time.ParseDuration(v); err != nil || d < 0 {
			return bad("%s %q is not a duration such as 30s", name, v)
		}
	}
	if (c.TLS.Cert == "") != (c.TLS.Key == "") {
		return bad("tls needs both cert and key")
	}
	limits := map[string]limitsConfig{"limits": c.Limits}
	for t, l := range c.Tenants {
		limits["tenants."+t] = l
	}
	for name, l := range limits {
		const u = api.Unlimited
		if l.MaxSandboxes < u || l.MaxConcurrentExecs < u || l.Burst < u || l.MaxConcurrentFileOps < u ||
			(l.RequestsPerSecond < 0 && l.RequestsPerSecond != u) {
			return bad("%s: a limit is omitted (the default), positive, or -1 (unlimited)", name)
		}
	}
	if c.Files.MaxTarEntries < 0 {
		return bad("files.max_tar_entries cannot be negative")
	}
	if list := c.Operator.Validate(); list.HasErrors() {
		return fault.New(fault.InvalidArgument, "fix the operator settings above (docs/SECURITY.md, \"Who may decide what\")",
			"server config %s:\n%s", path, list.Err())
	}
	return nil
}

func size(s string) int64 {
	n, _ := bytesize.Parse(s) // checked by check
	return n
}

func (c serverConfig) fileLimits() files.Limits {
	return files.Limits{MaxFileBytes: size(c.Files.MaxFile), MaxTarBytes: size(c.Files.MaxTar), MaxTarEntries: c.Files.MaxTarEntries}
}

func (c serverConfig) shutdownGrace() time.Duration { return duration(c.ShutdownGrace, 30*time.Second) }

// duration is a checked duration field, or def when it is empty.
func duration(v string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(v); err == nil {
		return d
	}
	return def
}

func (c serverConfig) tenantLimits() map[string]api.Limits {
	out := make(map[string]api.Limits, len(c.Tenants))
	for t, l := range c.Tenants {
		out[t] = l.api()
	}
	return out
}

// serveDrivers are the drivers a multi-tenant server offers: offered without the host passthrough, which comes
// back only as host_passthrough.user names it (never root) and unless SANDKEEP_HOST_PASSTHROUGH=deny. The
// single-user CLI keeps offeredDrivers' loud, recorded degrade as it is.
func (sc serverConfig) serveDrivers(offered []sandkeep.DriverOption) ([]sandkeep.DriverOption, error) {
	out := slices.DeleteFunc(slices.Clone(offered), func(o sandkeep.DriverOption) bool { return o.Option().Name == sandkeep.DriverHost })
	u := sc.HostPassthrough.User
	if u == "" || os.Getenv(envHostPassthrough) == "deny" {
		return out, nil
	}
	uid, gid, err := parseHostUser(u)
	if err != nil {
		return nil, err
	}
	return append(out, sandkeep.HostDriverAs(uid, gid)), nil
}

// parseHostUser reads host_passthrough.user: "uid:gid", numeric, neither 0.
func parseHostUser(s string) (uid, gid uint32, err error) {
	bad := func(why string) error {
		return fault.New(fault.InvalidArgument, `write host_passthrough: {user: "1500:1500"}, an unprivileged host uid:gid`,
			"host_passthrough.user %q %s", s, why)
	}
	us, gs, ok := strings.Cut(s, ":")
	u, uerr := strconv.ParseUint(us, 10, 32)
	g, gerr := strconv.ParseUint(gs, 10, 32)
	switch {
	case !ok || uerr != nil || gerr != nil:
		return 0, 0, bad("is not a numeric uid:gid")
	case u == 0 || g == 0:
		return 0, 0, bad("is root: a tenant's command never runs as root on the host")
	}
	return uint32(u), uint32(g), nil
}
