package lifecycle

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/internal/bytesize"
	"github.com/sandkeep/sandkeep/internal/channel"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// Defaults for Config's zero fields.
const (
	DefaultUser        = "1000:1000"
	DefaultPids        = 512
	DefaultMemory      = 2 << 30
	DefaultNanoCPUs    = 1e9
	DefaultTmpSize     = 256 << 20
	DefaultHomeSize    = 64 << 20
	DefaultGateWait    = 10 * time.Minute
	DefaultIdleTimeout = 30 * time.Minute
	DefaultRetention   = 24 * time.Hour
	DefaultStopGrace   = 5 * time.Second
	DefaultGrace       = 2 * time.Second
	// DefaultNofile is every sandbox process's RLIMIT_NOFILE, soft and hard. It must not exceed the engine's own
	// hard limit (runc cannot raise it: the container fails to start), which is 20000 on the CI host.
	DefaultNofile = 8192
)

// Config is what the lifecycle needs; zero fields take the defaults above.
type Config struct {
	Image     string // image ref used for every sandbox
	AgentPath string // the host path of the static sandkeep-agent binary

	User        string // "uid:gid"; root is refused unless AllowRoot
	AllowRoot   bool
	PidsLimit   int64
	MemoryBytes int64
	NanoCPUs    int64
	// RequestMemoryBytes and RequestNanoCPUs are what a sandbox reserves (a template's requests), at most the
	// limits above; zero reserves the limit.
	RequestMemoryBytes int64
	RequestNanoCPUs    int64
	TmpBytes           int64
	HomeBytes          int64
	// HomeDir is the sandbox's HOME, a tmpfs owned by its user; "" is driver.HomeDir. host_state auto sets the
	// operator's own home path, so that caches bound at their host paths are where tools look for them.
	HomeDir string
	Env     []string       // extra base environment, "K=V"
	Mounts  []driver.Mount // extra binds; each passes guard.CheckMount
	// Tmpfs are extra tmpfs mounts: target -> options as the spec writes them ("size=64m,mode=0700"). Each is
	// mounted rw,nosuid,nodev, owned by the sandbox user (mode 0755) unless the options say otherwise, and
	// 64 MiB unless they give a size.
	Tmpfs map[string]string
	// Companions are a compose-based devcontainer's runServices, run next to the sandbox by a driver with
	// driver.CompanionRunner after every ensure (companions.go). Not part of the posture hash.
	Companions []driver.Companion
	// NofileLimit is every sandbox process's RLIMIT_NOFILE (soft and hard); default DefaultNofile. Core dumps are
	// always off (RLIMIT_CORE 0): a crash would write up to the memory limit into the workspace.
	NofileLimit int64
	// Runtime is the engine's OCI runtime for sandboxes: "" (the engine's default, runc) or a runtime the
	// engine has registered, such as "runsc" (gVisor). Part of the posture: changing it recycles sandboxes.
	Runtime string
	// DiskBytes and DiskInodes, when DiskBytes is set, bound each workspace with a file system of its own of that
	// size and inode count (quota.go; needs root). DiskMaxBytes and DiskMaxInodes, when set, are the operator's
	// ceilings: a config (a spec's resources.disk) above them is refused. Changing them recycles sandboxes.
	DiskBytes     int64
	DiskInodes    int64
	DiskMaxBytes  int64
	DiskMaxInodes int64
	// UIDs gives each key's sandbox a host uid (and gid) of its own from this range instead of User (uids.go):
	// no two keys share one, and none is a host account's. The zero value is the default (DefaultUIDRange on the
	// Docker driver as root with User unset, see effectiveUIDs); UIDsOff is off. Changing it recycles sandboxes.
	UIDs UIDRange

	GateWait time.Duration // bound on waiting for a busy key
	// MaxKeys bounds the keys this process holds state for at once: gates of keys with a command running or
	// queued (past it a new key is KEY_LIMIT), cached uids and postures (forgotten past it). 0: DefaultMaxKeys.
	MaxKeys     int
	IdleTimeout time.Duration // a running sandbox idle this long is stopped
	Retention   time.Duration // a stopped sandbox this old is removed
	// SuspendAfter is, per template name, how long a sandbox of that template stays idle before the sweeper
	// suspends it (suspend.go): its container or pod removed, its workspace kept. Absent or 0: never.
	SuspendAfter map[string]time.Duration
	// PauseOnRetention names the templates whose sandboxes past Retention are suspended (suspend.go) rather
	// than removed: their workspaces are kept whatever RemoveWorkspace says.
	PauseOnRetention map[string]bool
	RemoveWorkspace  bool          // on retention removal, also delete the workspace
	StopGrace        time.Duration // what a stopping sandbox's processes get before SIGKILL
	Grace            time.Duration // what a command's tree gets between SIGTERM and SIGKILL

	// Transport is how commands reach the agent: TransportAuto (the persistent channel when it is up, else the
	// engine's exec), TransportAgent (the channel only) or TransportExec (the engine's exec only).
	Transport Transport

	// PostCreate, when set, runs once (`sh -c`) in every newly created sandbox before its first command;
	// PostCreateTimeout bounds it (default 10m). A post-create that fails removes the sandbox again, so the next
	// run retries it.
	PostCreate        string
	PostCreateTimeout time.Duration
	// PostStart, when set, runs (`sh -c`, bounded by PostCreateTimeout) at every start of a sandbox: after
	// PostCreate in a new one, and when a stopped one is started again. A failure fails the command with its
	// exit status and output tail (the sandbox is kept: its next start tries again).
	PostStart string
	// WorkspaceFolder, when set to a path other than /workspace, is where the workspace is also mounted (the
	// same directory) and where commands start; the workdir guard accepts paths under it. Part of the posture.
	WorkspaceFolder string
	// Volumes are named volumes the sandbox owns: each a directory of the key's under the state home, bound
	// at its target, kept across recycling and removed with the workspace (Remove). Part of the posture.
	Volumes []Volume
	// SetupTimeout bounds providing a sandbox (image pull, create, start, post-create); past it the command
	// fails with SANDBOX_SETUP_TIMEOUT (a retry may help). Default 15m.
	SetupTimeout time.Duration

	// Egress test hooks: the proxy's name resolution, dialling and upstream TLS roots (nil: the system's).
	EgressResolver      egress.Resolver
	EgressDial          func(ctx context.Context, network, addr string) (net.Conn, error)
	EgressUpstreamRoots *x509.CertPool
	// EgressRefused are ranges the proxy refuses like private ones unless an IP rule names them (operator).
	EgressRefused []netip.Prefix

	// HostServices are the operator's host endpoints a command may be given (ExecRequest.Services), sorted by
	// name: the i-th is at ServiceAddress(i) inside every sandbox with a channel directory (services.go).
	HostServices []HostService

	// OnEvent receives the events that belong to no caller's run (the sweeper's); may be nil.
	OnEvent Sink

	Logger *slog.Logger
	Now    func() time.Time // for tests; time.Now when nil
}

// RuntimeGVisor is gVisor's runtime name as Debian's runsc package and docker-up.sh register it. Sandboxes under
// it have no agent channel (transport.go): their commands go through the engine's exec.
const RuntimeGVisor = "runsc"

// Transport names how a command reaches the agent.
type Transport string

// Transports.
const (
	TransportAuto  Transport = "auto"
	TransportAgent Transport = "agent"
	TransportExec  Transport = "exec"
)

// ParseTransport checks a transport name; "" is auto.
func ParseTransport(s string) (Transport, error) {
	switch t := Transport(s); t {
	case "":
		return TransportAuto, nil
	case TransportAuto, TransportAgent, TransportExec:
		return t, nil
	}
	return "", fault.New(fault.InvalidArgument, "use auto, agent or exec", "unknown transport %q", s)
}

func (c *Config) setDefaults() {
	def := func(p *int64, v int64) {
		if *p <= 0 {
			*p = v
		}
	}
	defDur := func(p *time.Duration, v time.Duration) {
		if *p <= 0 {
			*p = v
		}
	}
	if c.User == "" {
		c.User = DefaultUser
	}
	def(&c.PidsLimit, DefaultPids)
	def(&c.MemoryBytes, DefaultMemory)
	def(&c.NanoCPUs, DefaultNanoCPUs)
	def(&c.TmpBytes, DefaultTmpSize)
	def(&c.HomeBytes, DefaultHomeSize)
	def(&c.NofileLimit, DefaultNofile)
	defDur(&c.GateWait, DefaultGateWait)
	defDur(&c.IdleTimeout, DefaultIdleTimeout)
	defDur(&c.Retention, DefaultRetention)
	defDur(&c.StopGrace, DefaultStopGrace)
	defDur(&c.Grace, DefaultGrace)
	defDur(&c.PostCreateTimeout, 10*time.Minute)
	defDur(&c.SetupTimeout, 15*time.Minute)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Transport == "" {
		c.Transport = TransportAuto
	}
}

// validate checks what Config cannot default: the image, the user, the extra mounts and env.
func (c *Config) validate() (uid, gid int, err error) {
	if c.Image == "" {
		return 0, 0, fault.New(fault.InvalidArgument, "pass --image or set SANDKEEP_IMAGE", "no image configured")
	}
	uid, gid, err = parseUser(c.User)
	if err != nil {
		return 0, 0, err
	}
	if err := c.checkHostServices(); err != nil {
		return 0, 0, err
	}
	if (uid == 0 || gid == 0) && !c.AllowRoot {
		return 0, 0, fault.New(fault.PostureRefused, "use a non-root uid:gid such as 1000:1000, or allow root explicitly",
			"sandbox user %q is root", c.User)
	}
	c.Mounts = slices.Clone(c.Mounts) // resolved below; the caller's slice stays as given
	for i, m := range c.Mounts {
		if err := guard.CheckMount(m); err != nil {
			return 0, 0, err
		}
		// Bind what was checked: the engine resolves the source again at create time, so a symlink swapped
		// in after the check must not redirect the bind.
		resolved, err := filepath.EvalSymlinks(m.Source)
		if err != nil {
			return 0, 0, fault.Wrap(err, fault.InvalidMount, "check that the mount source exists", "mount source %q", m.Source)
		}
		c.Mounts[i].Source = resolved
	}
	if err := guard.Env(c.Env); err != nil {
		return 0, 0, err
	}
	if _, err := ParseTransport(string(c.Transport)); err != nil {
		return 0, 0, err
	}
	if err := c.checkDisk(); err != nil {
		return 0, 0, err
	}
	if err := c.UIDs.check(); err != nil {
		return 0, 0, err
	}
	if !validRuntime(c.Runtime) {
		return 0, 0, fault.New(fault.InvalidArgument, "name a runtime registered with the engine, e.g. runsc (see `docker info`)",
			"runtime %q is not a runtime name", c.Runtime)
	}
	if err := c.checkFolderAndVolumes(); err != nil {
		return 0, 0, err
	}
	if h := c.HomeDir; h != "" && h != driver.HomeDir {
		if err := checkHomeDir(h); err != nil {
			return 0, 0, err
		}
	}
	for target := range c.Tmpfs {
		switch target {
		case "/tmp", driver.HomeDir, spec.SecretsDir, driver.WorkspaceDir, driver.AgentDir, channel.MountPoint:
			return 0, 0, fault.New(fault.InvalidMount, "give the tmpfs a target of its own",
				"tmpfs target %s is one of sandkeep's own", target)
		}
	}
	return uid, gid, nil
}

// checkFolderAndVolumes refuses a workspace folder or volume target that is not an absolute, clean path of
// its own: not /, not in the kernel's, the system's or sandkeep's own directories.
func (c *Config) checkFolderAndVolumes() error {
	own := func(what, p string) error {
		if p == "" || p == "/" || !path.IsAbs(p) || path.Clean(p) != p {
			return fault.New(fault.InvalidMount, "give an absolute, clean path such as /workspaces/app", "%s %q is not an absolute, clean path other than /", what, p)
		}
		for _, s := range []string{"/proc", "/sys", "/dev", "/bin", "/sbin", "/usr", "/lib", "/lib64", "/etc", "/boot", "/tmp",
			driver.AgentDir, spec.SecretsDir, channel.MountPoint, driver.WorkspaceDir} {
			if p == s || strings.HasPrefix(p, s+"/") || strings.HasPrefix(s, p+"/") {
				if what == "volume target" && strings.HasPrefix(p, driver.WorkspaceDir+"/") {
					continue // a volume inside the workspace (node_modules, target/) is fine
				}
				return fault.New(fault.InvalidMount, "choose a directory of its own, such as /workspaces/app", "%s %s overlaps %s", what, p, s)
			}
		}
		return nil
	}
	if c.WorkspaceFolder != "" && c.WorkspaceFolder != driver.WorkspaceDir {
		if err := own("workspace folder", c.WorkspaceFolder); err != nil {
			return err
		}
	}
	seen := map[string]bool{}
	for _, v := range c.Volumes {
		if err := own("volume target", v.Target); err != nil {
			return err
		}
		if v.Name != "" && !validVolumeName(v.Name) {
			return fault.New(fault.InvalidMount, "name volumes with letters, digits, '_', '.' and '-'", "volume name %q is not valid", v.Name)
		}
		if seen[v.Target] {
			return fault.New(fault.InvalidMount, "give each volume a target of its own", "two volumes at %s", v.Target)
		}
		seen[v.Target] = true
	}
	return nil
}

func validVolumeName(s string) bool {
	if s == "" || len(s) > 128 || !(s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z' || s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			return false
		}
	}
	return true
}

// checkDisk refuses a workspace quota that ext4 cannot hold or that passes the operator's ceilings.
func (c *Config) checkDisk() error {
	switch {
	case c.DiskBytes < 0 || c.DiskInodes < 0:
		return fault.New(fault.InvalidArgument, "give a positive size", "workspace quota %d bytes, %d inodes is negative", c.DiskBytes, c.DiskInodes)
	case c.DiskInodes > 0 && c.DiskBytes == 0:
		return fault.New(fault.InvalidArgument, "set resources.disk too: the inode bound is that of the workspace's file system",
			"resources.inodes without resources.disk")
	case c.DiskBytes > 0 && os.Geteuid() != 0:
		return fault.New(fault.SpecUnsupported, "run sandkeep as root, or drop resources.disk",
			"a workspace quota needs a loop mount, which needs root")
	case c.DiskBytes > 0 && c.DiskBytes < MinQuotaBytes:
		return fault.New(fault.InvalidArgument, "give at least 8m", "workspace quota of %d bytes is below the minimum of 8 MiB", c.DiskBytes)
	case c.DiskMaxBytes > 0 && c.DiskBytes > c.DiskMaxBytes:
		return fault.New(fault.PostureRefused, "ask for at most the operator's maximum, or have the operator raise it",
			"workspace quota of %d bytes is above the operator's maximum of %d", c.DiskBytes, c.DiskMaxBytes)
	case c.DiskMaxInodes > 0 && c.DiskInodes > c.DiskMaxInodes:
		return fault.New(fault.PostureRefused, "ask for at most the operator's maximum, or have the operator raise it",
			"workspace quota of %d inodes is above the operator's maximum of %d", c.DiskInodes, c.DiskMaxInodes)
	}
	return nil
}

// validRuntime: empty, or a name such as "runsc" or "io.containerd.runsc.v1" (letters, digits, . _ -).
func validRuntime(s string) bool {
	if len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

func parseUser(s string) (uid, gid int, err error) {
	u, g, ok := strings.Cut(s, ":")
	uid, uerr := strconv.Atoi(u)
	gid, gerr := strconv.Atoi(g)
	if !ok || uerr != nil || gerr != nil || uid < 0 || gid < 0 {
		return 0, 0, fault.New(fault.InvalidArgument, "write it as numeric uid:gid, e.g. 1000:1000",
			"sandbox user %q is not uid:gid", s)
	}
	return uid, gid, nil
}

// Volume is one of Config.Volumes. Name is [A-Za-z0-9][A-Za-z0-9_.-]* or "" (keyed by the target).
type Volume struct {
	Name     string
	Target   string
	ReadOnly bool
}

// dirName is the volume's directory name under the key's volumes directory.
func (v Volume) dirName() string {
	if v.Name != "" {
		return "n-" + v.Name
	}
	return "t-" + strings.NewReplacer("/", "_").Replace(strings.TrimPrefix(v.Target, "/"))
}

// posture builds the key's posture: the single place where the sandbox's security shape is decided. chanDir,
// when set, is the key's channel directory: bound read-only, with the agent's init told to dial the socket in
// it. It does not depend on this process's Transport, so processes with different transports agree.
func (c *Config) posture(workspace, volumes, agentDir, chanDir string, uid, gid int) driver.Posture {
	mounts := []driver.Mount{
		{Source: workspace, Target: driver.WorkspaceDir},
		{Source: agentDir, Target: driver.AgentDir, ReadOnly: true},
	}
	if c.WorkspaceFolder != "" && c.WorkspaceFolder != driver.WorkspaceDir {
		mounts = append(mounts, driver.Mount{Source: workspace, Target: c.WorkspaceFolder})
	}
	for _, v := range c.Volumes {
		mounts = append(mounts, driver.Mount{Source: filepath.Join(volumes, v.dirName()), Target: v.Target, ReadOnly: v.ReadOnly})
	}
	initArgv := []string{driver.AgentPath, "init"}
	if chanDir != "" {
		mounts = append(mounts, driver.Mount{Source: chanDir, Target: channel.MountPoint, ReadOnly: true})
		initArgv = append(initArgv, "--channel", channel.SocketPath, "--egress", EgressListen)
		for i := range c.HostServices {
			initArgv = append(initArgv, "--service", ServiceAddress(i))
		}
	}
	mounts = append(mounts, c.Mounts...)
	home := c.HomeDir
	if home == "" {
		home = driver.HomeDir
	}
	env := append([]string{"HOME=" + home, "TMPDIR=/tmp"}, c.Env...)
	p := driver.Posture{
		User:            fmt.Sprintf("%d:%d", uid, gid),
		ReadOnlyRoot:    true,
		CapDrop:         []string{"ALL"},
		NoNewPrivileges: true,
		PidsLimit:       c.PidsLimit,
		MemoryBytes:     c.MemoryBytes,
		MemorySwapBytes: c.MemoryBytes,
		NanoCPUs:        c.NanoCPUs,
		// A request above its limit is refused by the engine's template check; capped here as well, so a
		// posture never asks to reserve more than it may use.
		RequestNanoCPUs:    min(c.RequestNanoCPUs, c.NanoCPUs),
		RequestMemoryBytes: min(c.RequestMemoryBytes, c.MemoryBytes),
		Tmpfs: map[string]string{
			// Owned by the sandbox user: runc gives a tmpfs the mode of the image's directory it covers (an image's
			// /tmp may be 0755 root), so ownership is what keeps /tmp writable whatever the image; the agent's init
			// also sets the mode back to 1777 (init_linux.go).
			"/tmp": fmt.Sprintf("rw,noexec,nosuid,nodev,size=%d,uid=%d,gid=%d,mode=1777", c.TmpBytes, uid, gid),
			home:   fmt.Sprintf("rw,nosuid,nodev,size=%d,uid=%d,gid=%d,mode=0700", c.HomeBytes, uid, gid),
			// Secret files (secrets.go) live here, for one command each. Mounted always, whatever the run asks for:
			// the posture never depends on a run's secrets, so runs with and without them share a sandbox.
			spec.SecretsDir: fmt.Sprintf("rw,noexec,nosuid,nodev,size=1m,uid=%d,gid=%d,mode=0700", uid, gid),
		},
		Env:         env,
		Network:     "none",
		Mounts:      mounts,
		LogMaxSize:  "1m",
		LogMaxFiles: "2",
		Init:        initArgv,
		Seccomp:     driver.SeccompProfile(),
		Ulimits: []driver.Ulimit{
			{Name: "core", Soft: 0, Hard: 0},
			{Name: "nofile", Soft: c.NofileLimit, Hard: c.NofileLimit},
		},
		StopSignal:      "SIGKILL",
		Runtime:         c.Runtime,
		WorkspaceBytes:  c.DiskBytes,
		WorkspaceInodes: c.DiskInodes,
	}
	for target, opts := range c.Tmpfs {
		p.Tmpfs[target] = extraTmpfs(opts, uid, gid)
	}
	return p
}

// kernelSize is a tmpfs size the kernel reads as written (memparse: a number and k, m, g, t or p).
var kernelSize = regexp.MustCompile(`^[0-9]+[kKmMgGtTpP]?$`)

// extraTmpfs is the option string of a spec tmpfs: always rw,nosuid,nodev; owned by the sandbox user, mode 0755
// and 64 MiB unless the spec says otherwise.
func extraTmpfs(opts string, uid, gid int) string {
	out := []string{"rw", "nosuid", "nodev"}
	has := map[string]bool{}
	for _, o := range strings.Split(opts, ",") {
		if o == "" {
			continue
		}
		k, v, _ := strings.Cut(o, "=")
		has[k] = true
		if k == "size" && !kernelSize.MatchString(v) {
			// The spec reads sizes as bytesize does (64MiB, 64Mi, 1.5g); the kernel's tmpfs only 64m. Sizes
			// it reads stay as written, so a sandbox made before this rewrite keeps its posture hash.
			if n, err := bytesize.Parse(v); err == nil {
				o = "size=" + strconv.FormatInt(n, 10)
			}
		}
		out = append(out, o)
	}
	// A fixed order: the string is hashed into the posture.
	for _, d := range [][2]string{{"size", "64m"}, {"mode", "0755"}, {"uid", strconv.Itoa(uid)}, {"gid", strconv.Itoa(gid)}} {
		if !has[d[0]] {
			out = append(out, d[0]+"="+d[1])
		}
	}
	return strings.Join(out, ",")
}

// checkHomeDir refuses a HOME that is not an absolute, clean path of its own: not /, not a system directory or
// under one, not sandkeep's own directories.
func checkHomeDir(h string) error {
	if h == "/" || !path.IsAbs(h) || path.Clean(h) != h {
		return fault.New(fault.InvalidMount, "give the sandbox's home as an absolute, clean path such as /home/dev",
			"home %q is not an absolute, clean path other than /", h)
	}
	for _, s := range []string{"/proc", "/sys", "/dev", "/bin", "/sbin", "/usr", "/lib", "/lib64", "/etc", "/boot", "/var", "/run",
		"/root", driver.AgentDir, spec.SecretsDir, channel.MountPoint, driver.WorkspaceDir} {
		if h == s || strings.HasPrefix(h, s+"/") || strings.HasPrefix(s, h+"/") {
			return fault.New(fault.InvalidMount, "run sandkeep as a user whose home is elsewhere (e.g. /home/dev), or leave host_state unset",
				"the sandbox's home %s would be over %s", h, s)
		}
	}
	return nil
}
