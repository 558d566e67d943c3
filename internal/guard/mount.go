package guard

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// mountForm is the hint for any malformed mount string.
const mountForm = "write it as type=bind,source=/abs/host/path,target=/abs/sandbox/path[,readonly]"

// denied is one host path a sandbox must never see, with why, for the message.
type denied struct {
	path string // clean absolute; a "*" name matches any one name
	why  string
}

// runtimeWhy explains the runtime-socket entries once.
const runtimeWhy = "a container runtime socket: access to it is root on the host"

// deniedSources are refused as mount sources at or under them, and, through the ancestor rule, any source that
// contains one of them (binding /var or /run or /etc would expose them). Entries beyond the minimum list
// (/dev, /run/docker, /var/lib/docker, /var/lib/containerd, /etc/kubernetes, /var/lib/kubelet, /etc/rancher)
// are there because each is host-root or cluster-admin by another door.
var deniedSources = []denied{
	{"/var/run/docker.sock", runtimeWhy},
	{"/run/docker.sock", runtimeWhy},
	{"/run/docker", "the Docker daemon's state directory"},
	{"/var/run/docker", "the Docker daemon's state directory"},
	{"/run/containerd", runtimeWhy},
	{"/var/run/containerd", runtimeWhy},
	{"/run/podman", runtimeWhy},
	{"/var/run/podman", runtimeWhy},
	{"/run/crio", runtimeWhy},
	{"/var/run/crio", runtimeWhy},
	{"/run/k3s", runtimeWhy},
	{"/run/user/*/docker.sock", runtimeWhy},
	{"/run/user/*/podman", runtimeWhy},
	{"/var/lib/docker", "the Docker daemon's storage, which holds every container's filesystem"},
	{"/var/lib/containerd", "containerd's storage, which holds every container's filesystem"},
	{"/var/lib/kubelet", "the kubelet's directory, which holds every pod's secrets"},
	{"/etc/kubernetes", "the cluster's admin credentials"},
	{"/etc/rancher", "the k3s admin kubeconfig"},
	{"/proc", "the host's process table"},
	{"/sys", "the host's kernel interfaces"},
	{"/dev", "the host's devices"},
	{"/root", "root's home directory"},
	{"/boot", "the host's kernel and boot loader"},
	{"/etc/shadow", "the host's password hashes"},
	{"/etc/gshadow", "the host's group password hashes"},
	{"/etc/sudoers", "the host's sudo rules"},
	{"/etc/sudoers.d", "the host's sudo rules"},
}

// credentialNames are refused as any name of a mount source: they hold keys and tokens.
var credentialNames = []string{
	".ssh", ".aws", ".gnupg", ".kube", ".docker", ".gcloud", ".azure", ".npmrc", ".pypirc",
	".netrc", ".git-credentials",
}

// credentialPairs are refused as two consecutive names of a mount source.
var credentialPairs = [][2]string{{".config", "gcloud"}, {".config", "gh"}}

// homeMarkers are directories whose presence directly inside a source marks it as a home directory: binding it
// would expose them even though no name of the source is a credential name.
var homeMarkers = []string{".ssh", ".aws", ".gnupg", ".kube", ".azure", ".gcloud", ".config/gcloud"}

// systemTargets may not be a mount target, nor have a target as an ancestor: the sandbox needs them intact.
var systemTargets = []string{
	"/bin", "/sbin", "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/sys", "/dev", "/boot",
	"/var", "/run", "/root",
}

// sealedTargets may not have a mount at or under them: kernel interfaces and the agent's own directory.
var sealedTargets = []string{"/proc", "/sys", "/dev", driver.AgentDir}

// ownTargets are sandkeep's own binds and scratch space; targets beneath them are fine.
var ownTargets = []string{driver.WorkspaceDir, "/tmp"}

// ParseMount parses Docker's --mount syntax (type=bind,source=/a,target=/b,readonly) and checks the result
// with CheckMount. Keys are case-insensitive as in Docker; only bind mounts are supported.
func ParseMount(s string) (driver.Mount, error) {
	fields, err := mountFields(s)
	if err != nil {
		return driver.Mount{}, err
	}
	m, err := mountFromFields(s, fields)
	if err != nil {
		return driver.Mount{}, err
	}
	if err := CheckMount(m); err != nil {
		return driver.Mount{}, err
	}
	return m, nil
}

// SplitMount parses Docker's --mount syntax like ParseMount, without the deny-lists: an error means the
// string is malformed, not that it asks for a refused path. Check the result with CheckMount before use.
func SplitMount(s string) (driver.Mount, error) {
	fields, err := mountFields(s)
	if err != nil {
		return driver.Mount{}, err
	}
	return mountFromFields(s, fields)
}

// mountKeys maps every accepted spelling of a key to its canonical name.
var mountKeys = map[string]string{
	"type": "type", "src": "source", "source": "source", "dst": "target", "destination": "target",
	"target": "target", "readonly": "readonly", "ro": "readonly",
}

// mountFields splits s into canonical key -> value. A bare key has value "" and is only allowed for readonly.
func mountFields(s string) (map[string]string, error) {
	if s == "" {
		return nil, fault.New(fault.InvalidMount, mountForm, "mount is empty")
	}
	fields := map[string]string{}
	for _, f := range strings.Split(s, ",") {
		rawKey, value, hasValue := strings.Cut(f, "=")
		key, ok := mountKeys[strings.ToLower(rawKey)]
		switch {
		case f == "":
			return nil, fault.New(fault.InvalidMount, mountForm, "mount %q has an empty field", s)
		case !ok:
			return nil, fault.New(fault.InvalidMount, mountForm+" (other keys are not supported)", "mount %q has unknown key %q", s, rawKey)
		case hasValue && value == "":
			return nil, fault.New(fault.InvalidMount, mountForm, "mount %q has an empty value for %q", s, rawKey)
		case !hasValue && key != "readonly":
			return nil, fault.New(fault.InvalidMount, mountForm, "mount %q has key %q without a value", s, rawKey)
		}
		if _, dup := fields[key]; dup {
			return nil, fault.New(fault.InvalidMount, mountForm+" (each key once)", "mount %q gives %s more than once", s, key)
		}
		fields[key] = value
	}
	return fields, nil
}

// mountFromFields turns canonical fields into a Mount.
func mountFromFields(s string, fields map[string]string) (driver.Mount, error) {
	if err := mountType(s, fields["type"]); err != nil {
		return driver.Mount{}, err
	}
	ro, err := readOnly(s, fields)
	if err != nil {
		return driver.Mount{}, err
	}
	for _, key := range []string{"source", "target"} {
		if _, ok := fields[key]; !ok {
			return driver.Mount{}, fault.New(fault.InvalidMount, mountForm, "mount %q has no %s", s, key)
		}
	}
	return driver.Mount{Source: fields["source"], Target: fields["target"], ReadOnly: ro}, nil
}

// mountType accepts bind (the default) and names the alternative for the types Docker knows but sandkeep
// does not take here.
func mountType(s, typ string) error {
	switch strings.ToLower(typ) {
	case "", "bind":
		return nil
	case "volume":
		return fault.New(fault.InvalidMount, "bind a host directory instead (type=bind,source=/abs/host/dir,target=/workspace/data); the sandbox's /workspace already persists across sessions",
			"mount %q has type volume, which is not supported", s)
	case "tmpfs":
		return fault.New(fault.InvalidMount, "declare it in the spec's tmpfs field (target and options) instead of as a mount",
			"mount %q has type tmpfs, which is not supported as a mount", s)
	default:
		return fault.New(fault.InvalidMount, mountForm, "mount %q has type %q; only bind is supported", s, typ)
	}
}

// readOnly reads the readonly flag: bare, or true|false|1|0.
func readOnly(s string, fields map[string]string) (bool, error) {
	v, ok := fields["readonly"]
	if !ok {
		return false, nil
	}
	switch v {
	case "", "true", "1":
		return true, nil
	case "false", "0":
		return false, nil
	}
	return false, fault.New(fault.InvalidMount, "write readonly, or readonly=true|false|1|0", "mount %q has readonly=%q", s, v)
}

// CheckMount applies the deny-lists to m. The source is checked as written and, because it must exist on the
// host, again after resolving its symlinks: a link to the Docker socket is refused like the socket itself.
func CheckMount(m driver.Mount) error {
	if err := checkSource(m.Source); err != nil {
		return err
	}
	if err := checkTarget(m.Target); err != nil {
		return err
	}
	return checkHostSource(m.Source)
}

// checkShape refuses a path that is not absolute and already clean. Requiring a clean path (rather than
// cleaning it) means what is checked is byte for byte what Docker binds.
func checkShape(what, p string) error {
	const hint = "give an absolute, clean path such as /home/you/project (no .., //, trailing / or control characters)"
	if strings.HasPrefix(p, "-") {
		return fault.New(fault.InvalidMount, hint, "mount %s %q starts with '-'", what, p)
	}
	if why := badChar(p); why != "" {
		return fault.New(fault.InvalidMount, hint, "mount %s %q %s", what, p, why)
	}
	if !path.IsAbs(p) {
		return fault.New(fault.InvalidMount, hint, "mount %s %q is not an absolute path", what, p)
	}
	if path.Clean(p) != p {
		return fault.New(fault.InvalidMount, hint, "mount %s %q is not clean (it should read %q)", what, p, path.Clean(p))
	}
	return nil
}

// checkSource applies the lexical source rules to p.
func checkSource(p string) error {
	if err := checkShape("source", p); err != nil {
		return err
	}
	if err := checkDeniedSource(p); err != nil {
		return err
	}
	return checkCredentialNames(p)
}

// checkDeniedSource refuses a source at, under or above a denied host path.
func checkDeniedSource(p string) error {
	const hint = "bind a project directory that holds only what the sandbox needs, e.g. source=/home/you/project"
	if p == "/" {
		return fault.New(fault.InvalidMount, hint, "mount source %q is denied: it is the host's root directory", p)
	}
	for _, d := range deniedSources {
		if atOrUnder(p, d.path) {
			return fault.New(fault.InvalidMount, hint, "mount source %q is denied: it is at or under %s (%s)", p, d.path, d.why)
		}
		if ancestorOf(p, d.path) {
			return fault.New(fault.InvalidMount, hint, "mount source %q is denied: it contains %s (%s)", p, d.path, d.why)
		}
	}
	return nil
}

// checkCredentialNames refuses a source any of whose names is a credential store.
func checkCredentialNames(p string) error {
	const hint = "do not bind credential stores; pass the one secret the sandbox needs through the spec's secret files"
	names := components(p)
	for i, n := range names {
		for _, c := range credentialNames {
			if n == c {
				return fault.New(fault.InvalidMount, hint, "mount source %q is denied: its name %s holds credentials", p, c)
			}
		}
		for _, pair := range credentialPairs {
			if n == pair[0] && i+1 < len(names) && names[i+1] == pair[1] {
				return fault.New(fault.InvalidMount, hint, "mount source %q is denied: %s/%s holds credentials", p, pair[0], pair[1])
			}
		}
	}
	return nil
}

// checkTarget applies the target rules: the sandbox's system directories, kernel interfaces and sandkeep's own
// binds stay as sandkeep made them.
func checkTarget(p string) error {
	if err := checkShape("target", p); err != nil {
		return err
	}
	if p == "/" {
		return fault.New(fault.InvalidMount, "mount under /workspace/, e.g. target=/workspace/data", "mount target %q is denied: it is the sandbox's root directory", p)
	}
	for _, d := range sealedTargets {
		if atOrUnder(p, d) {
			return fault.New(fault.InvalidMount, "mount under /workspace/, e.g. target=/workspace/data", "mount target %q is denied: it is at or under %s", p, d)
		}
	}
	for _, d := range systemTargets {
		if p == d || ancestorOf(p, d) {
			return fault.New(fault.InvalidMount, "mount under /workspace/ or a new directory such as /opt/data", "mount target %q is denied: it would cover the system directory %s", p, d)
		}
	}
	for _, d := range ownTargets {
		if p == d {
			return fault.New(fault.InvalidMount, "mount beneath it instead, e.g. target="+d+"/data", "mount target %q is denied: %s is managed by sandkeep", p, d)
		}
	}
	return nil
}

// checkHostSource looks at the source on the host: it must exist (Docker would otherwise create it as root),
// its resolved path must pass the lexical rules, it must be a directory or a regular file (a socket or device
// is a capability, not data), and it must not be a home directory.
func checkHostSource(p string) error {
	resolved, err := filepath.EvalSymlinks(p)
	if errors.Is(err, fs.ErrNotExist) {
		return fault.Wrap(err, fault.InvalidMount, "create the directory first, or fix the path", "mount source %q does not exist", p)
	}
	if err != nil {
		return fault.Wrap(err, fault.InvalidMount, "check the path and its permissions", "mount source %q cannot be resolved", p)
	}
	if resolved != p {
		if err := checkSource(resolved); err != nil {
			return resolvedDenied(p, resolved, err)
		}
	}
	info, err := os.Stat(resolved)
	if err != nil {
		return fault.Wrap(err, fault.InvalidMount, "check the path and its permissions", "mount source %q cannot be read", p)
	}
	if !info.IsDir() && !info.Mode().IsRegular() {
		return fault.New(fault.InvalidMount, "bind a directory or a regular file", "mount source %q is denied: it is a %s, not a directory or regular file", p, fileKind(info.Mode()))
	}
	return checkHome(p, resolved, info)
}

// resolvedDenied reports a source whose symlink-resolved path broke a rule, keeping that rule's sentence.
func resolvedDenied(p, resolved string, err error) error {
	var fe *fault.Error
	if !errors.As(err, &fe) {
		return fault.Wrap(err, fault.InvalidMount, "bind the real directory", "mount source %q resolves to %q, which is denied", p, resolved)
	}
	return fault.Wrap(err, fault.InvalidMount, "bind the real directory, not a link to a denied one",
		"mount source %q resolves through a symlink: %s", p, fe.Message)
}

// checkHome refuses a directory that directly holds a credential store: it is a home directory, and binding
// it would expose them.
func checkHome(p, resolved string, info fs.FileInfo) error {
	if !info.IsDir() {
		return nil
	}
	for _, m := range homeMarkers {
		if _, err := os.Lstat(filepath.Join(resolved, m)); err == nil {
			return fault.New(fault.InvalidMount, "bind the project directory inside it instead, e.g. source="+p+"/project",
				"mount source %q is denied: it holds %s, so it looks like a home directory", p, m)
		}
	}
	return nil
}

// fileKind names a non-regular file mode for a message.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}
