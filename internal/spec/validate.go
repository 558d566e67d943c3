package spec

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/sandkeep/sandkeep/internal/bytesize"
	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
)

// Limits and fixed places a spec is checked against.
const (
	// SecretsDir is the tmpfs sandkeep mounts for secret files; every secret file's path is beneath it.
	SecretsDir = "/run/secrets"
	// DefaultSecretMode is a secret file's mode when the spec gives none.
	DefaultSecretMode fs.FileMode = 0o400

	MinCPUs     = 0.01      // below it Docker's NanoCPUs rounds to 0, which means unlimited
	MaxCPUs     = 64.0      // a sandbox for an agent, not a build farm
	MinMemory   = 6 << 20   // Docker's own minimum
	MinPids     = 16        // fewer and a shell cannot run a pipeline
	MaxPids     = 1 << 22   // Linux's pid_max ceiling
	maxUserName = 32        // useradd's limit
	maxID       = 1<<32 - 2 // (uid_t)-1 means "no change" to the kernel
)

const (
	cpusHint   = "give cpus from 0.01 to 64, e.g. cpus: 1.5"
	pidsHint   = "give pids of at least 16, e.g. pids: 512"
	inodesHint = "give a whole number of files, e.g. inodes: 100000"
	// MinDisk is the smallest workspace quota: ext4's metadata and journal need a few MiB.
	MinDisk = 8 << 20
)

// Validate checks a Sandbox that did not come from Parse (an API request, a fused devcontainer): the same
// checks Parse runs after reading the file, reported without positions, each message naming its field
// (sandbox.tmpfs[1]). A zero field is unset and not checked.
func (s Sandbox) Validate() diag.List {
	c := &checker{}
	validate(&s, c)
	return c.list
}

// checker collects diagnostics. pos maps a field path (sandbox.build.context, sandbox.mounts[2],
// sandbox.env.NAME) to the YAML node it was read from; it is nil for Validate, whose diagnostics have no
// position.
type checker struct {
	file string
	pos  map[string]*yaml.Node
	list diag.List
}

// atNode adds a diagnostic at n.
func (c *checker) atNode(sev diag.Severity, code diag.Code, n *yaml.Node, hint, format string, args ...any) {
	d := diag.Diagnostic{Code: code, Severity: sev, File: c.file, Message: fmt.Sprintf(format, args...), Hint: hint}
	if n != nil {
		d.Line, d.Column = n.Line, n.Column
	}
	c.list = append(c.list, d)
}

// at adds a diagnostic at the node of field, or of its nearest enclosing field that has one.
func (c *checker) at(sev diag.Severity, code diag.Code, field, hint, format string, args ...any) {
	c.atNode(sev, code, c.node(field), hint, format, args...)
}

func (c *checker) errorf(code diag.Code, field, hint, format string, args ...any) {
	c.at(diag.Error, code, field, hint, format, args...)
}

// node finds the node of field or of its nearest parent: sandbox.build.dockerfile falls back to sandbox.build.
func (c *checker) node(field string) *yaml.Node {
	for c.pos != nil && field != "" {
		if n, ok := c.pos[field]; ok {
			return n
		}
		if strings.HasSuffix(field, "]") {
			field = field[:strings.LastIndexByte(field, '[')]
			continue
		}
		i := strings.LastIndexByte(field, '.')
		if i < 0 {
			return nil
		}
		field = field[:i]
	}
	return nil
}

// badText says why s may not be the value of a field, or "". Control characters (C0, DEL, C1) break logs,
// terminals and argv; bidirectional overrides make text read differently from what runs (a post_create that
// shows one command and runs another). Tab and newline are allowed where free text is (post_create, env
// values, build args).
func badText(s string, freeText bool) string {
	if !utf8.ValidString(s) {
		return "is not valid UTF-8"
	}
	for _, r := range s {
		switch {
		case freeText && (r == '\t' || r == '\n'):
		case unicode.IsControl(r):
			return fmt.Sprintf("contains the control character %U", r)
		case r >= 0x202A && r <= 0x202E, r >= 0x2066 && r <= 0x2069:
			return fmt.Sprintf("contains the bidirectional formatting character %U", r)
		}
	}
	return ""
}

// text reports a field whose value has control characters (SK106) and returns whether it is clean. The
// message never quotes the value: it may be a secret.
func (c *checker) text(field, s string) bool {
	return c.textAs(diag.SpecControlChar, field, s, false)
}

func (c *checker) textAs(code diag.Code, field, s string, freeText bool) bool {
	why := badText(s, freeText)
	if why == "" {
		return true
	}
	hint := "remove the control characters"
	if freeText {
		hint = "remove the control characters; only tab and newline are allowed here"
	}
	c.errorf(code, field, hint, "%s %s", field, why)
	return false
}

// validate runs every value check on s. Parse calls it after reading the file (so pos places each
// diagnostic); Validate without positions.
func validate(s *Sandbox, c *checker) {
	c.mode(s.Mode)
	if s.Image != "" {
		c.text("sandbox.image", s.Image)
	}
	if s.Image != "" && s.Build != nil {
		c.errorf(diag.SpecImageAndBuild, "sandbox.build", "keep image: to run a prebuilt image, or build: to build one from a Dockerfile, not both",
			"image and build are both set: a sandbox has one or the other")
	}
	if s.Build != nil {
		c.build(s.Build)
	}
	if s.User != "" && c.text("sandbox.user", s.User) {
		if why := checkUser(s.User); why != "" {
			c.errorf(diag.SpecUser, "sandbox.user", `write a user name (dev), a uid (1000) or uid:gid ("1000:1000")`, "sandbox.user %q %s", s.User, why)
		}
	}
	c.envMap("sandbox.env", s.Env)
	mountTargets := c.mounts(s.Mounts)
	c.tmpfs(s.Tmpfs, mountTargets)
	if s.Resources != nil {
		c.resources(s.Resources)
	}
	if s.PostCreate != "" {
		c.textAs(diag.SpecPostCreate, "sandbox.post_create", s.PostCreate, true)
	}
	if s.WorkspaceFolder != "" && c.text("sandbox.workspace_folder", s.WorkspaceFolder) {
		c.workspaceFolder(s.WorkspaceFolder)
	}
	switch s.HostState {
	case "", "auto", "none":
	default:
		c.errorf(diag.SpecHostState, "sandbox.host_state", "write host_state: none (no host state bound in) or auto",
			"invalid host_state %q: want auto or none", s.HostState)
	}
	c.secretFiles(s.SecretFiles)
	if s.Network != nil {
		c.network(s.Network)
	}
}

func (c *checker) mode(m string) {
	const field = "sandbox.mode"
	switch m {
	case ModeInherit, ModeNone, ModeAuto, ModeInline:
		return
	case "allowlist", "denylist", "open":
		c.errorf(diag.SpecNetworkModeMisuse, field,
			fmt.Sprintf("set sandbox.mode to auto or inline (or leave it out), and write network: {mode: %s, rules: [...]} under sandbox", m),
			"%s is a network mode: write it under sandbox.network.mode", m)
		return
	}
	hint := "write mode: auto (sandboxed when a driver is available, else on the host), inline (always sandboxed, refused otherwise) or none, or leave it out to inherit"
	switch l := strings.ToLower(strings.TrimSpace(m)); l {
	case ModeNone, ModeAuto, ModeInline:
		hint = fmt.Sprintf("write it in lower case without spaces: mode: %s", l)
	}
	c.errorf(diag.SpecMode, field, hint, `invalid mode %q: want "", none, auto or inline`, m)
}

func (c *checker) build(b *Build) {
	const buildHint = "give paths relative to the directory of sandkeep.yaml, inside it, without .. (context: ., dockerfile: .devcontainer/Dockerfile)"
	if b.Dockerfile == "" {
		c.errorf(diag.SpecBuildDockerfile, "sandbox.build.dockerfile", "write build: {dockerfile: .devcontainer/Dockerfile, context: .}", "sandbox.build has no dockerfile")
	} else if c.text("sandbox.build.dockerfile", b.Dockerfile) && !local(b.Dockerfile) {
		c.errorf(diag.SpecBuildPath, "sandbox.build.dockerfile", buildHint, "sandbox.build.dockerfile %q escapes the repository root", b.Dockerfile)
	}
	if b.Context != "" && c.text("sandbox.build.context", b.Context) && !local(b.Context) {
		c.errorf(diag.SpecBuildPath, "sandbox.build.context", buildHint, "sandbox.build.context %q escapes the repository root", b.Context)
	}
	c.envMap("sandbox.build.args", b.Args)
}

// local reports whether p is a relative path that stays inside the directory it is relative to, lexically.
// Symlinks are the builder's to confine (it opens the context through os.Root).
func local(p string) bool {
	if p == "" || path.IsAbs(p) || strings.HasPrefix(p, `\`) {
		return false
	}
	cl := path.Clean(p)
	return cl != ".." && !strings.HasPrefix(cl, "../")
}

// userName is a user or group name as shadow-utils and Docker accept it.
var userName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`)

// checkUser says why u is not a name, a uid or uid:gid, or "".
func checkUser(u string) string {
	uid, gid, hasGID := strings.Cut(u, ":")
	switch {
	case uid == "" || hasGID && gid == "":
		return "has an empty part"
	case hasGID:
		if why := checkID(uid); why != "" {
			return "has a uid that " + why + " (a group goes with a numeric uid: uid:gid)"
		}
		if why := checkID(gid); why != "" {
			return "has a gid that " + why
		}
		return ""
	case uid[0] >= '0' && uid[0] <= '9':
		if why := checkID(uid); why != "" {
			return why
		}
		return ""
	case len(uid) > maxUserName:
		return fmt.Sprintf("is longer than %d characters", maxUserName)
	case !userName.MatchString(uid):
		return "is not a user name (letters, digits, _, . and -, not starting with a digit, - or .)"
	}
	return ""
}

// checkID says why s is not a decimal id from 0 to 2^32-2 written without leading zeros, or "".
func checkID(s string) string {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || strconv.FormatUint(n, 10) != s {
		return "is not a decimal number"
	}
	if n > maxID {
		return fmt.Sprintf("is over %d", uint64(maxID))
	}
	return ""
}

// envMap checks environment variables or build args, in name order so the report is stable. Messages never
// quote a value.
func (c *checker) envMap(field string, env map[string]string) {
	names := make([]string, 0, len(env))
	for name := range env {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		f := field + "." + name
		if !c.text(f, name) || !c.textAs(diag.SpecControlChar, f, env[name], true) {
			continue
		}
		if err := guard.EnvVar(name, env[name]); err != nil {
			msg, hint := faultText(err)
			c.errorf(diag.SpecEnv, f, hint, "%s: %s", field, msg)
		}
	}
}

// faultText is the message and hint of a guard refusal.
func faultText(err error) (msg, hint string) {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return fe.Message, fe.Hint
	}
	return err.Error(), ""
}

// mounts checks each mount with the guard and returns the targets of those that pass. A source that does
// not exist yet is a warning: the spec may be checked on another machine than the one it runs on, and the
// guard checks the source again, on the host, when the sandbox is made.
func (c *checker) mounts(mounts []string) map[string]bool {
	targets := map[string]bool{}
	for i, m := range mounts {
		f := fmt.Sprintf("sandbox.mounts[%d]", i)
		if !c.text(f, m) {
			continue
		}
		mt, err := guard.ParseMount(m)
		if err != nil {
			msg, hint := faultText(err)
			sev := diag.Error
			if errors.Is(err, fs.ErrNotExist) {
				sev = diag.Warning
			}
			c.at(sev, diag.SpecMount, f, hint, "%s", msg)
			if sev == diag.Warning {
				if t := mountTarget(m); t != "" {
					targets[t] = true
				}
			}
			continue
		}
		if targets[mt.Target] {
			c.errorf(diag.SpecMount, f, "give each mount its own target", "mount target %q is used twice", mt.Target)
		}
		targets[mt.Target] = true
	}
	return targets
}

// mountTarget is the target of a mount string the guard parsed but could not finish checking.
func mountTarget(m string) string {
	for _, field := range strings.Split(m, ",") {
		k, v, _ := strings.Cut(field, "=")
		switch strings.ToLower(k) {
		case "target", "dst", "destination":
			return v
		}
	}
	return ""
}

// Where a tmpfs may not go: the kernel's and sandkeep's own directories, the system directories (or a parent
// of one), the workspace, and the secrets tmpfs.
var (
	tmpfsSealed = []string{"/proc", "/sys", "/dev", driver.AgentDir, SecretsDir}
	tmpfsSystem = []string{"/bin", "/sbin", "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/boot", "/var", "/run", "/root", driver.WorkspaceDir}
)

const tmpfsHint = "write /abs/path[:options] with options from size=<n>[k|m|g], mode=<octal>, uid=<n>, gid=<n>, noexec, exec, nosuid, nodev, e.g. /cache:size=64m,noexec"

func (c *checker) tmpfs(entries []string, mountTargets map[string]bool) {
	seen := map[string]bool{}
	for i, e := range entries {
		f := fmt.Sprintf("sandbox.tmpfs[%d]", i)
		if !c.text(f, e) {
			continue
		}
		target, opts, hasOpts := strings.Cut(e, ":")
		if why := tmpfsTarget(target); why != "" {
			c.errorf(diag.SpecTmpfs, f, tmpfsHint, "tmpfs %q: the target %s", e, why)
			continue
		}
		if hasOpts {
			if why := tmpfsOptions(opts); why != "" {
				c.errorf(diag.SpecTmpfs, f, tmpfsHint, "tmpfs %q: %s", e, why)
				continue
			}
		}
		switch {
		case seen[target]:
			c.errorf(diag.SpecTmpfs, f, "give each tmpfs its own target", "tmpfs target %q is used twice", target)
		case mountTargets[target]:
			c.errorf(diag.SpecTmpfs, f, "give the tmpfs a target of its own", "tmpfs target %q is also a mount target", target)
		}
		seen[target] = true
	}
}

// tmpfsTarget says why t cannot be a tmpfs target, or "".
func tmpfsTarget(t string) string {
	switch {
	case t == "":
		return "is empty"
	case !path.IsAbs(t):
		return "is not an absolute path"
	case path.Clean(t) != t:
		return fmt.Sprintf("is not clean (it should read %q)", path.Clean(t))
	case t == "/":
		return "is the root directory"
	}
	for _, d := range tmpfsSealed {
		if t == d || strings.HasPrefix(t, d+"/") {
			return "is at or under " + d + ", which sandkeep manages"
		}
	}
	for _, d := range tmpfsSystem {
		if t == d || strings.HasPrefix(d, t+"/") {
			return "would cover " + d
		}
	}
	return ""
}

// tmpfsOptions says why opts is not a list of the tmpfs options sandkeep passes on, or "".
func tmpfsOptions(opts string) string {
	seen := map[string]bool{}
	for _, o := range strings.Split(opts, ",") {
		key, value, hasValue := strings.Cut(o, "=")
		canon := key
		if key == "exec" || key == "noexec" {
			canon = "exec"
		}
		if seen[canon] {
			return fmt.Sprintf("option %s is given more than once (or with its opposite)", key)
		}
		seen[canon] = true
		switch key {
		case "noexec", "exec", "nosuid", "nodev":
			if hasValue {
				return fmt.Sprintf("option %s takes no value", key)
			}
		case "size":
			n, err := bytesize.Parse(value)
			if err != nil {
				return fmt.Sprintf("size=%v", err)
			}
			if n == 0 {
				return "size=0 would mean unlimited: give a positive size such as 64m"
			}
		case "mode":
			if v, err := strconv.ParseUint(value, 8, 32); err != nil || v > 0o7777 || len(value) < 3 || len(value) > 5 {
				return fmt.Sprintf("mode=%q is not an octal mode such as 1777", value)
			}
		case "uid", "gid":
			if why := checkID(value); why != "" {
				return fmt.Sprintf("%s=%q %s", key, value, why)
			}
		case "":
			return "has an empty option"
		default:
			return fmt.Sprintf("option %q is not supported", key)
		}
	}
	return ""
}

func (c *checker) resources(r *Resources) {
	if r.CPUs != 0 && !(r.CPUs >= MinCPUs && r.CPUs <= MaxCPUs) {
		c.errorf(diag.SpecResources, "sandbox.resources.cpus", cpusHint, "sandbox.resources.cpus is %v; want %v to %v", r.CPUs, MinCPUs, MaxCPUs)
	}
	if r.Memory != "" && c.text("sandbox.resources.memory", r.Memory) {
		n, err := bytesize.Parse(r.Memory)
		switch {
		case err != nil:
			c.errorf(diag.SpecResources, "sandbox.resources.memory", "write a size such as memory: 512m, 512Mi or 2g", "sandbox.resources.memory: %v", err)
		case n < MinMemory:
			c.errorf(diag.SpecResources, "sandbox.resources.memory", "give at least 6m, e.g. memory: 512m", "sandbox.resources.memory %q is below the minimum of 6m", r.Memory)
		}
	}
	if r.Disk != "" && c.text("sandbox.resources.disk", r.Disk) {
		n, err := bytesize.Parse(r.Disk)
		switch {
		case err != nil:
			c.errorf(diag.SpecResources, "sandbox.resources.disk", "write a size such as disk: 512m, 64Mi or 10g", "sandbox.resources.disk: %v", err)
		case n < MinDisk:
			c.errorf(diag.SpecResources, "sandbox.resources.disk", "give at least 8m, e.g. disk: 1g", "sandbox.resources.disk %q is below the minimum of 8m", r.Disk)
		}
	}
	if r.Inodes != 0 && r.Disk == "" {
		c.errorf(diag.SpecResources, "sandbox.resources.inodes", "set disk too, e.g. disk: 1g", "sandbox.resources.inodes bounds the workspace's own file system, which needs sandbox.resources.disk")
	}
	if r.Inodes < 0 {
		c.errorf(diag.SpecResources, "sandbox.resources.inodes", inodesHint, "sandbox.resources.inodes is %d", r.Inodes)
	}
	if r.Pids != 0 && (r.Pids < MinPids || r.Pids > MaxPids) {
		c.errorf(diag.SpecResources, "sandbox.resources.pids", pidsHint, "sandbox.resources.pids is %d; want %d to %d", r.Pids, MinPids, MaxPids)
	}
}

func (c *checker) workspaceFolder(w string) {
	const hint = "give an absolute, clean path other than /, e.g. workspace_folder: /workspace"
	switch {
	case !path.IsAbs(w):
		c.errorf(diag.SpecWorkspaceFolder, "sandbox.workspace_folder", hint, "sandbox.workspace_folder %q is not an absolute path", w)
	case path.Clean(w) != w:
		c.errorf(diag.SpecWorkspaceFolder, "sandbox.workspace_folder", hint, "sandbox.workspace_folder %q is not clean (it should read %q)", w, path.Clean(w))
	case w == "/":
		c.errorf(diag.SpecWorkspaceFolder, "sandbox.workspace_folder", hint, "sandbox.workspace_folder is the root directory")
	}
}

// secretName is a secret's name: also a file name, so no slashes.
var secretName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,255}$`)

// ValidSecretName reports whether name may name a secret file: letters, digits, '.', '_' and '-', 1 to 255
// bytes, and not "." or "..".
func ValidSecretName(name string) bool {
	return secretName.MatchString(name) && name != "." && name != ".."
}

func (c *checker) secretFiles(files []SecretFile) {
	names := map[string]int{}
	paths := map[string]int{}
	for i, sf := range files {
		f := fmt.Sprintf("sandbox.secret_files[%d]", i)
		if !c.text(f+".name", sf.Name) || !c.text(f+".path", sf.Path) || !c.text(f+".from_env", sf.FromEnv) ||
			!c.text(f+".from_file", sf.FromFile) || !c.text(f+".mode", sf.Mode) {
			continue
		}
		switch {
		case sf.Name == "":
			c.errorf(diag.SpecSecretFile, f+".name", "name the secret, e.g. name: npmrc", "%s has no name", f)
		case !ValidSecretName(sf.Name):
			c.errorf(diag.SpecSecretFile, f+".name", "use letters, digits, '.', '_' and '-' only", "%s.name %q is not a valid secret name", f, sf.Name)
		default:
			if j, dup := names[sf.Name]; dup {
				c.errorf(diag.SpecSecretFile, f+".name", "give each secret its own name", "%s.name %q is also the name of secret_files[%d]", f, sf.Name, j)
			}
			names[sf.Name] = i
		}
		if why := secretPath(sf.Path); why != "" {
			c.errorf(diag.SpecSecretFile, f+".path", "give an absolute, clean path under "+SecretsDir+", e.g. path: "+SecretsDir+"/npmrc", "%s.path %s", f, why)
		} else {
			for p, j := range paths {
				if p == sf.Path || strings.HasPrefix(sf.Path, p+"/") || strings.HasPrefix(p, sf.Path+"/") {
					c.errorf(diag.SpecSecretFile, f+".path", "give each secret a file of its own", "%s.path %q collides with the path %q of secret_files[%d]", f, sf.Path, p, j)
					break
				}
			}
			paths[sf.Path] = i
		}
		c.secretSource(f, sf)
		if sf.Mode != "" {
			if _, err := ParseSecretMode(sf.Mode); err != nil {
				c.errorf(diag.SpecSecretFile, f+".mode", `write an octal mode with a leading zero that lets the owner read, e.g. mode: "0400"`, "%s.mode: %v", f, err)
			}
		}
	}
}

// secretPath says why p cannot be a secret file's path, or "".
func secretPath(p string) string {
	switch {
	case p == "":
		return "is missing"
	case !path.IsAbs(p):
		return fmt.Sprintf("%q is not an absolute path", p)
	case path.Clean(p) != p:
		return fmt.Sprintf("%q is not clean (it should read %q)", p, path.Clean(p))
	case !strings.HasPrefix(p, SecretsDir+"/"):
		return fmt.Sprintf("%q is not under %s, the tmpfs secrets live on (never /workspace or /tmp, which persist or are shared)", p, SecretsDir)
	}
	return ""
}

// secretSource checks where a secret's value comes from. An entry with neither from_env nor from_file is a
// reference to a secret the operator defined under that name (internal/tier resolves it); a source is the
// operator's to give, and internal/tier refuses one from a repository.
func (c *checker) secretSource(f string, sf SecretFile) {
	const hint = "give at most one of from_env: NAME (a variable of the caller's environment) and from_file: /abs/host/path, or neither to use the operator's secret of that name"
	switch {
	case sf.FromEnv == "" && sf.FromFile == "":
		// a reference by name
	case sf.FromEnv != "" && sf.FromFile != "":
		c.errorf(diag.SpecSecretFile, f+".from_file", hint, "%s gives both from_env and from_file", f)
	case sf.FromEnv != "":
		if err := guard.EnvVar(sf.FromEnv, ""); err != nil {
			msg, h := faultText(err)
			c.errorf(diag.SpecSecretFile, f+".from_env", h, "%s.from_env: %s", f, msg)
		}
	case !path.IsAbs(sf.FromFile) || path.Clean(sf.FromFile) != sf.FromFile:
		c.errorf(diag.SpecSecretFile, f+".from_file", "give an absolute, clean host path, e.g. from_file: /home/you/.npmrc", "%s.from_file %q is not an absolute, clean path", f, sf.FromFile)
	}
}

// secretMode is an octal mode with a leading 0 (or 0o): "400" would be read as decimal by some tools and as
// octal by others, so it is refused.
var secretMode = regexp.MustCompile(`^0[oO]?([0-7]{1,4})$`)

// ParseSecretMode reads a secret file's mode: octal with a leading zero ("0400", "0o440"), at most 0777, and
// readable by its owner. "" is DefaultSecretMode.
func ParseSecretMode(s string) (fs.FileMode, error) {
	if s == "" {
		return DefaultSecretMode, nil
	}
	m := secretMode.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%q is not an octal mode with a leading zero", s)
	}
	v, _ := strconv.ParseUint(m[1], 8, 32)
	switch {
	case v > 0o777:
		return 0, fmt.Errorf("%q is over 0777", s)
	case v&0o400 == 0:
		return 0, fmt.Errorf("%q does not let the owner read the file", s)
	}
	return fs.FileMode(v), nil
}

// credName is an environment variable name, as credentials use them: one a shell can expand ($NAME).
var credName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// ValidCredentialName reports whether name may name a network credential (and the variable its placeholder is
// in): a shell identifier of at most 128 bytes.
func ValidCredentialName(name string) bool { return credName.MatchString(name) }

// rule checks one egress rule at field f and reports whether it is valid.
func (c *checker) rule(f, r string) bool {
	if !c.text(f, r) {
		return false
	}
	if _, err := egress.ParseRule(r); err != nil {
		var re *egress.RuleError
		if !errors.As(err, &re) {
			c.errorf(diag.RuleHost, f, "", "%s: %v", f, err)
			return false
		}
		c.errorf(re.Code, f, re.Hint, "%s", re.Message)
		return false
	}
	return true
}

// presetName is the form of a preset's name; whether the preset exists is for the operator's config to say.
var presetName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

func (c *checker) network(n *Network) {
	switch n.Mode {
	case "", "none", "allowlist", "denylist", "open":
	case ModeAuto, ModeInline:
		c.errorf(diag.SpecNetwork, "sandbox.network.mode", "write sandbox.mode: "+n.Mode+" for the sandbox, and network.mode: none, allowlist, denylist or open",
			"%s is a sandbox mode: write it under sandbox.mode", n.Mode)
	default:
		c.errorf(diag.SpecNetwork, "sandbox.network.mode", "write network: {mode: allowlist, rules: [...]}, or mode: none, denylist or open",
			"invalid network mode %q: want none, allowlist, denylist or open", n.Mode)
	}
	switch n.Inherit {
	case "", "append", "replace":
	default:
		c.errorf(diag.SpecNetwork, "sandbox.network.inherit", "write inherit: append (add to the spec's rules) or replace",
			"invalid network inherit %q: want append or replace", n.Inherit)
	}
	if n.Preset != "" && c.text("sandbox.network.preset", n.Preset) && !presetName.MatchString(n.Preset) {
		c.errorf(diag.SpecNetwork, "sandbox.network.preset", "name a preset in lower-case letters, digits, - and _, e.g. preset: default",
			"invalid network preset name %q", n.Preset)
	}
	switch n.Inspect {
	case "", "auto", "on", "off":
	default:
		c.errorf(diag.SpecNetwork, "sandbox.network.inspect", "write inspect: auto (on when credentials are injected), on or off",
			"invalid TLS inspection setting %q", n.Inspect)
	}
	for i, r := range n.Rules {
		c.rule(fmt.Sprintf("sandbox.network.rules[%d]", i), r)
	}
	names := map[string]int{}
	for i, cr := range n.Credentials {
		f := fmt.Sprintf("sandbox.network.credentials[%d]", i)
		if !credName.MatchString(cr.Name) {
			c.errorf(diag.SpecNetwork, f+".name", "name it like an environment variable, e.g. name: GITHUB_TOKEN",
				"%s.name %q is not an environment variable name", f, cr.Name)
		} else if j, dup := names[cr.Name]; dup {
			c.errorf(diag.SpecNetwork, f+".name", "give each credential its own name", "%s.name %q is also the name of credentials[%d]", f, cr.Name, j)
		}
		names[cr.Name] = i
		if cr.FromEnv == "" && cr.Hosts == nil {
			continue // a reference to the operator's credential of that name (internal/tier resolves it)
		}
		if !credName.MatchString(cr.FromEnv) {
			c.errorf(diag.SpecNetwork, f+".from_env", "name the host environment variable that holds the value, e.g. from_env: GH_TOKEN",
				"%s.from_env %q is not an environment variable name", f, cr.FromEnv)
		}
		if len(cr.Hosts) == 0 {
			c.errorf(diag.SpecNetwork, f+".hosts", "list the hosts it may be sent to, e.g. hosts: [api.github.com]",
				"%s names no host: the credential could go nowhere", f)
		}
		var placement *fault.Error
		if errors.As(egress.CheckCredentialPlacement(cr.Header, cr.Scheme, cr.Fields), &placement) {
			c.errorf(diag.SpecNetwork, f, placement.Hint, "%s: %s", f, placement.Message)
		}
		for j, h := range cr.Hosts {
			hf := fmt.Sprintf("%s.hosts[%d]", f, j)
			if c.rule(hf, h) && strings.HasPrefix(h, "!") {
				c.errorf(diag.SpecNetwork, hf, "list only the hosts it may go to", "%s %q is negated", hf, h)
			}
		}
	}
	if len(n.Credentials) > 0 && (n.Mode == "" || n.Mode == "none") {
		c.errorf(diag.SpecNetwork, "sandbox.network.mode", "choose mode: allowlist with the credentials' hosts, or remove the credentials",
			"credentials need a network, and the network mode is none")
	}
	if n.Mode == "none" && (len(n.Rules) > 0 || n.Preset != "") {
		c.at(diag.Warning, diag.SpecNetwork, "sandbox.network.mode", "remove the rules and preset, or choose mode: allowlist",
			"network mode none allows no traffic: its rules and preset have no effect")
	}
}
