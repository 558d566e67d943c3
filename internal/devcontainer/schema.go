package devcontainer

import (
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/tailscale/hujson"

	"github.com/sandkeep/sandkeep/internal/bytesize"
	"github.com/sandkeep/sandkeep/internal/diag"
)

// Drop is one thing devcontainer.json asked for that would weaken the sandbox's posture, and that sandkeep
// dropped instead of obeying: the sandbox runs hardened without it. Each becomes one item of the
// sandbox_devcontainer_dropped event and one SK202 warning; nothing here fails a run.
type Drop struct {
	Field string // the top-level field it came from: runArgs, privileged, capAdd, securityOpt, mounts, initializeCommand, remoteUser ...
	Item  string // what was asked, as written (a flag with its value, a mount, a capability)
	Why   string // why it is dropped, one sentence without a trailing period
	Line  int    // 1-based position of the value in the file; 0 when unknown
	Col   int
}

// String is the drop in one line: "runArgs --cap-add=SYS_PTRACE (it gives the container power over the host)".
func (d Drop) String() string {
	if d.Item == "" || d.Item == d.Field {
		return fmt.Sprintf("%s (%s)", d.Field, d.Why)
	}
	return fmt.Sprintf("%s %s (%s)", d.Field, d.Item, d.Why)
}

// Volume is a type=volume mount of devcontainer.json: a named volume the sandbox owns (one per key and name,
// removed with the sandbox; see spec.Volume). Name is the file's source, "" for an anonymous volume.
type Volume struct {
	Name     string
	Target   string
	ReadOnly bool
}

// HostRequirements are the minimums the file asks of the host. sandkeep reads cpus and memory as the sandbox's
// limits, within the operator's caps (Fuse); storage is recorded only; a GPU is dropped (Config.Dropped).
type HostRequirements struct {
	CPUs    float64
	Memory  string // a size as written ("8gb"), which bytesize.Parse reads
	Storage string
}

// silentFields are read by other tools only and ignored without a word: editor settings and labels.
var silentFields = map[string]bool{
	"name": true, "customizations": true, "extensions": true, "settings": true, "portsAttributes": true,
	"otherPortsAttributes": true, "userEnvProbe": true, "waitFor": true, "$schema": true, "devPort": true,
	"secrets": true, "remoteEnvProbe": true,
}

// knownFields are the fields Parse reads; any other top-level field (not silent) is an SK208 warning.
var knownFields = map[string]bool{
	"image": true, "build": true, "dockerFile": true, "context": true, "runArgs": true, "containerEnv": true,
	"remoteEnv": true, "containerUser": true, "remoteUser": true, "updateRemoteUserUID": true, "mounts": true,
	"workspaceFolder": true, "workspaceMount": true, "dockerComposeFile": true, "service": true, "runServices": true,
	"features": true, "overrideFeatureInstallOrder": true, "initializeCommand": true, "onCreateCommand": true,
	"updateContentCommand": true, "postCreateCommand": true, "postStartCommand": true, "postAttachCommand": true,
	"privileged": true, "capAdd": true, "securityOpt": true, "init": true, "overrideCommand": true,
	"shutdownAction": true, "hostRequirements": true, "forwardPorts": true, "appPort": true,
}

// maxItem bounds a dropped item's text, in bytes: events and lines stay small whatever the file holds.
const maxItem = 256

// drop records one dropped item and its SK202 warning.
func (p *parser) drop(cfg *Config, off int, field, item, why string) {
	if len(item) > maxItem {
		item = item[:maxItem] + "…"
	}
	d := Drop{Field: field, Item: item, Why: why}
	if off >= 0 {
		d.Line, d.Col = lineCol(p.src, off)
	}
	if len(cfg.Dropped) < maxDiags { // a hostile file costs bounded work; the count is in SK216
		cfg.Dropped = append(cfg.Dropped, d)
	}
	what := field
	if item != "" && item != field {
		what = fmt.Sprintf("%s %q", field, short(item))
	}
	p.warn(diag.DevcontainerDropped, off, "nothing to do: the sandbox runs hardened without it; remove it from devcontainer.json to silence this",
		"%s is dropped: %s", what, why)
}

// numericUser is a uid or uid:gid, which names the sandbox's identity itself (the operator's to set).
var numericUser = regexp.MustCompile(`^[0-9]+(:[0-9]+)?$`)

// users reads remoteUser and containerUser. A name (vscode, node) is the image's convention for its user:
// recorded and mapped onto the sandbox's uid, which the operator owns. "root" is dropped and reported (the
// sandbox never runs as root because a file asks). A numeric uid[:gid] asks for the identity itself and goes
// to Config.User, which the repository tier refuses (SK501) as before.
func (p *parser) users(fields map[string]member, cfg *Config) {
	for _, name := range []string{"remoteUser", "containerUser"} {
		m, ok := fields[name]
		if !ok {
			continue
		}
		u := p.user(m)
		switch {
		case u == "":
		case numericUser.MatchString(u):
			if cfg.User == "" {
				cfg.User = u
				p.pos["user"] = m.val.StartOffset
				p.pos[name] = m.val.StartOffset
			}
		case u == "root":
			p.drop(cfg, m.val.StartOffset, name, u, "the sandbox runs as the operator's uid, never as root because a repository asks")
		default:
			if name == "remoteUser" {
				cfg.RemoteUser = u
			} else {
				cfg.ContainerUser = u
			}
		}
	}
	if m, ok := fields["updateRemoteUserUID"]; ok {
		if b, ok := p.boolean(`"updateRemoteUserUID"`, m.val); ok {
			cfg.UpdateRemoteUserUID = &b
		}
	}
}

// lifecycle reads the lifecycle commands. initializeCommand runs on the host: never for a repository's file.
func (p *parser) lifecycle(fields map[string]member, cfg *Config) {
	for _, c := range []struct {
		name string
		dst  *string
	}{
		{"onCreateCommand", &cfg.OnCreate}, {"updateContentCommand", &cfg.UpdateContent},
		{"postCreateCommand", &cfg.PostCreate}, {"postStartCommand", &cfg.PostStart}, {"postAttachCommand", &cfg.PostAttach},
	} {
		m, ok := fields[c.name]
		if !ok {
			continue
		}
		p.where = c.name
		*c.dst = p.command(m)
		p.where = ""
		if badCommand(*c.dst) {
			p.errorf(diag.DevcontainerValue, m.val.StartOffset, "remove the control characters (tab and newline are fine)",
				"%s has a control character other than tab and newline, or invalid UTF-8", c.name)
			*c.dst = ""
		}
	}
	if m, ok := fields["initializeCommand"]; ok {
		p.drop(cfg, m.key.StartOffset, "initializeCommand", "", "it runs on the host, and sandkeep never runs a repository's command outside the sandbox")
	}
}

// command reads a lifecycle command: a shell string, an argv (joined with joinArgv), or an object of named
// commands run in parallel; the object form waits for all of them and fails with the first failing status.
func (p *parser) command(m member) string {
	what := fmt.Sprintf("%q", m.name)
	switch m.val.Value.(type) {
	case *hujson.Object:
		obj := m.val.Value.(*hujson.Object)
		var parts []string
		for i := range obj.Members {
			mm := &obj.Members[i]
			name := mm.Name.Value.(hujson.Literal).String()
			c := p.command(member{name: m.name + "." + name, key: &mm.Name, val: &mm.Value})
			if c != "" {
				parts = append(parts, c)
			}
		}
		return parallel(parts)
	case *hujson.Array:
		args, ok := p.strList(what, m.val)
		if !ok || len(args) == 0 {
			return ""
		}
		argv := make([]string, len(args))
		for i, a := range args {
			argv[i] = a.s
		}
		return joinArgv(argv)
	default:
		s, _ := p.str(what, m.val)
		return s
	}
}

// parallel runs command lines at once in one shell and exits with the first non-zero status among them.
func parallel(cmds []string) string {
	switch len(cmds) {
	case 0:
		return ""
	case 1:
		return cmds[0]
	}
	var b strings.Builder
	for i, c := range cmds {
		fmt.Fprintf(&b, "( %s\n) & p%d=$!\n", c, i)
	}
	b.WriteString("s=0\n")
	for i := range cmds {
		fmt.Fprintf(&b, "wait $p%d || { r=$?; [ $s -eq 0 ] && s=$r; }\n", i)
	}
	b.WriteString("exit $s")
	return b.String()
}

// boolean reads a JSON boolean.
func (p *parser) boolean(what string, v *hujson.Value) (bool, bool) {
	lit, ok := v.Value.(hujson.Literal)
	if !ok || (lit.Kind() != 't' && lit.Kind() != 'f') {
		p.errorf(diag.DevcontainerType, v.StartOffset, "", "%s must be a boolean, not %s", what, kindName(v.Value))
		return false, false
	}
	return lit.Bool(), true
}

// posture drops the posture fields of the schema: privileged, capAdd, securityOpt (the runArgs spellings are
// in runArgs), and the ports a file publishes on the host (appPort).
func (p *parser) posture(fields map[string]member, cfg *Config) {
	if m, ok := fields["privileged"]; ok {
		if b, ok := p.boolean(`"privileged"`, m.val); ok && b {
			p.drop(cfg, m.val.StartOffset, "privileged", "true", "it gives the container power over the host")
		}
	}
	for _, name := range []string{"capAdd", "securityOpt"} {
		m, ok := fields[name]
		if !ok {
			continue
		}
		list, _ := p.strList(fmt.Sprintf("%q", name), m.val)
		for _, a := range list {
			why := "it gives the container power over the host"
			if name == "securityOpt" {
				why = "it turns off a confinement (seccomp, AppArmor, no-new-privileges) sandkeep keeps on"
			}
			p.drop(cfg, a.off, name, a.s, why)
		}
	}
	if m, ok := fields["appPort"]; ok {
		p.drop(cfg, m.val.StartOffset, "appPort", "", "it publishes the sandbox's ports on the host; forwardPorts is recorded instead")
	}
}

// schema reads the rest: init, overrideCommand, shutdownAction, hostRequirements, forwardPorts, the raw
// features and compose fields, and warns about unknown fields.
func (p *parser) schema(fields map[string]member, cfg *Config) {
	for _, b := range []struct {
		name string
		dst  **bool
	}{{"init", &cfg.Init}, {"overrideCommand", &cfg.OverrideCommand}} {
		if m, ok := fields[b.name]; ok {
			if v, ok := p.boolean(fmt.Sprintf("%q", b.name), m.val); ok {
				*b.dst = &v
			}
		}
	}
	if m, ok := fields["shutdownAction"]; ok {
		if s, ok := p.str(`"shutdownAction"`, m.val); ok {
			switch s {
			case "none", "stopContainer", "stopCompose":
				cfg.ShutdownAction = s
			default:
				p.errorf(diag.DevcontainerValue, m.val.StartOffset, `write "none", "stopContainer" or "stopCompose"`, "shutdownAction %q is not known", short(s))
			}
		}
	}
	if m, ok := fields["hostRequirements"]; ok {
		p.hostRequirements(m, cfg)
	}
	if m, ok := fields["forwardPorts"]; ok {
		p.forwardPorts(m, cfg)
	}
	if m, ok := fields["features"]; ok {
		cfg.Features = p.features(m) // installed by internal/devcontainer/feature
		p.pos["features"] = m.key.StartOffset
	}
	for name, m := range fields {
		if !knownFields[name] && !silentFields[name] {
			p.warn(diag.DevcontainerUnsupported, m.key.StartOffset, "remove it, or check its spelling against https://containers.dev/implementors/json_reference/",
				"field %q is not known to sandkeep; it is ignored", short(name))
		}
	}
}

// hostRequirements reads cpus, memory and storage; a gpu request is dropped (GPUs are the operator's to offer).
func (p *parser) hostRequirements(m member, cfg *Config) {
	obj := p.object(`"hostRequirements"`, m.val)
	if obj == nil {
		return
	}
	hr := &HostRequirements{}
	for i := range obj.Members {
		mm := &obj.Members[i]
		name := mm.Name.Value.(hujson.Literal).String()
		lit, _ := mm.Value.Value.(hujson.Literal)
		switch name {
		case "cpus":
			n, err := strconv.ParseFloat(string(lit), 64)
			if lit.Kind() != '0' || err != nil || n < 0 {
				p.errorf(diag.DevcontainerType, mm.Value.StartOffset, "", `"hostRequirements.cpus" must be a non-negative number`)
				continue
			}
			hr.CPUs = n
		case "memory", "storage":
			s, ok := p.str(`"hostRequirements.`+name+`"`, &mm.Value)
			if !ok {
				continue
			}
			if _, err := bytesize.Parse(s); err != nil {
				p.errorf(diag.DevcontainerValue, mm.Value.StartOffset, `write a size such as "8gb" or "512mb"`, "hostRequirements.%s: %v", name, &bytesize.Error{Input: short(s)})
				continue
			}
			if name == "memory" {
				hr.Memory = s
			} else {
				hr.Storage = s
			}
		case "gpu":
			if lit.Kind() == 'f' || (lit.Kind() == '"' && lit.String() == "optional") {
				continue
			}
			p.drop(cfg, mm.Value.StartOffset, "hostRequirements", "gpu", "GPUs are given to a sandbox only when the operator offers them")
		}
	}
	cfg.HostRequirements = hr
}

// forwardPorts records the ports (numbers, or "host:port" strings) the file asks to forward. Nothing is
// published: the record is for port forwarding.
func (p *parser) forwardPorts(m member, cfg *Config) {
	arr, ok := m.val.Value.(*hujson.Array)
	if !ok {
		p.errorf(diag.DevcontainerType, m.val.StartOffset, "", `"forwardPorts" must be an array, not %s`, kindName(m.val.Value))
		return
	}
	for i := range arr.Elements {
		e := &arr.Elements[i]
		lit, _ := e.Value.(hujson.Literal)
		switch lit.Kind() {
		case '0':
			n, err := strconv.Atoi(string(lit))
			if err != nil || n < 1 || n > 65535 {
				p.errorf(diag.DevcontainerValue, e.StartOffset, "give a port between 1 and 65535", "forwardPorts[%d] is not a port", i)
				continue
			}
			cfg.ForwardPorts = append(cfg.ForwardPorts, strconv.Itoa(n))
		case '"':
			s := lit.String()
			if hasControl(s) || s == "" {
				p.errorf(diag.DevcontainerValue, e.StartOffset, `write a port or "host:port"`, "forwardPorts[%d] is not a port", i)
				continue
			}
			cfg.ForwardPorts = append(cfg.ForwardPorts, s)
		default:
			p.errorf(diag.DevcontainerType, e.StartOffset, "", "forwardPorts[%d] must be a number or a string, not %s", i, kindName(e.Value))
		}
	}
}

// volume reads a type=volume mount into Config.Volumes.
func (p *parser) volume(cfg *Config, off int, fields []string) {
	v := Volume{}
	for _, f := range fields {
		k, val, _ := strings.Cut(f, "=")
		switch strings.ToLower(k) {
		case "source", "src":
			v.Name = val
		case "target", "dst", "destination":
			v.Target = val
		case "readonly", "ro":
			v.ReadOnly = val == "" || val == "true" || val == "1"
		case "type", "volume-nocopy", "volume-opt", "volume-driver":
			if strings.EqualFold(k, "volume-driver") || strings.EqualFold(k, "volume-opt") {
				p.drop(cfg, off, "mounts", f, "a volume's driver and options are the operator's; a local volume is made")
			}
		default:
			p.errorf(diag.DevcontainerMountRefused, off, "write type=volume,source=name,target=/abs/path", "volume mount key %q is not known", short(k))
			return
		}
	}
	if v.Name != "" && !namedVolume.MatchString(v.Name) {
		p.errorf(diag.DevcontainerMountRefused, off, "name the volume with letters, digits, '_', '.' and '-'", "volume name %q is not a volume name", short(v.Name))
		return
	}
	if why := scratchTarget(v.Target, p.containerWS); why != "" {
		p.errorf(diag.DevcontainerMountRefused, off, "give the volume a target of its own, such as /home/vscode/.cache", "volume target %q %s", short(v.Target), why)
		return
	}
	cfg.Volumes = append(cfg.Volumes, v)
}

// tmpfsMount reads a type=tmpfs mount into Config.Tmpfs in the spec's "target[:options]" form. Its size is
// bounded by the spec's tmpfs rules when the fused spec is validated.
func (p *parser) tmpfsMount(cfg *Config, off int, fields []string) {
	target, size := "", ""
	for _, f := range fields {
		k, val, _ := strings.Cut(f, "=")
		switch strings.ToLower(k) {
		case "target", "dst", "destination":
			target = val
		case "tmpfs-size":
			size = val
		case "type", "source", "src", "tmpfs-mode":
		default:
			p.errorf(diag.DevcontainerMountRefused, off, "write type=tmpfs,target=/abs/path[,tmpfs-size=64m]", "tmpfs mount key %q is not known", short(k))
			return
		}
	}
	if why := scratchTarget(target, p.containerWS); why != "" {
		p.errorf(diag.DevcontainerMountRefused, off, "give the tmpfs a target of its own, such as /cache", "tmpfs target %q %s", short(target), why)
		return
	}
	t := target
	if size != "" {
		if _, err := strconv.ParseUint(strings.TrimRight(strings.ToLower(size), "kmg"), 10, 64); err != nil {
			p.errorf(diag.DevcontainerMountRefused, off, "write tmpfs-size as a size such as 64m", "tmpfs-size %q is not a size", short(size))
			return
		}
		t += ":size=" + strings.ToLower(size)
	}
	cfg.Tmpfs = append(cfg.Tmpfs, t)
}

// scratchTarget says why target may not hold a volume or tmpfs, or "": it must be absolute and clean, not /,
// not in the kernel's or sandkeep's own directories, and not the workspace itself.
func scratchTarget(target, workspace string) string {
	switch {
	case target == "" || !path.IsAbs(target) || path.Clean(target) != target || hasControl(target):
		return "is not an absolute, clean path"
	case target == "/":
		return "is the root directory"
	case target == workspace || target == "/workspace":
		return "is the workspace, which is the sandbox's own"
	}
	for _, s := range []string{"/proc", "/sys", "/dev", "/run/secrets", "/run/sandkeep", "/opt/sandkeep"} {
		if target == s || strings.HasPrefix(target, s+"/") {
			return "is under " + s + ", which is sealed"
		}
	}
	return ""
}

// workspaceMount honours the target of workspaceMount: the workspace is mounted there (and workspaceFolder
// defaults to it). Its source must be the repository itself (${localWorkspaceFolder}); another source would
// bind a host path, and is dropped with the rest of the mount.
func (p *parser) workspaceMount(m member, cfg *Config) {
	s, ok := p.str(`"workspaceMount"`, m.val)
	if !ok || s == "" {
		return
	}
	var source, target string
	for _, f := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(f, "=")
		switch strings.ToLower(k) {
		case "source", "src":
			source = v
		case "target", "dst", "destination":
			target = v
		}
	}
	if source != "" && p.env.WorkspaceFolder != "" && path.Clean(source) != path.Clean(p.env.WorkspaceFolder) {
		p.drop(cfg, m.val.StartOffset, "workspaceMount", short(s), "its source is not the repository; the workspace is the sandbox's own directory")
		return
	}
	if target == "" || target == "/" || !path.IsAbs(target) || path.Clean(target) != target || hasControl(target) {
		p.errorf(diag.DevcontainerWorkspaceFolder, m.val.StartOffset, "give target=/abs/path, such as target=/workspaces/app",
			"workspaceMount target %q is not an absolute, clean path other than /", short(target))
		return
	}
	cfg.WorkspaceMount = target
	if cfg.WorkspaceFolder == "" {
		cfg.WorkspaceFolder = target
	}
}

// buildOptions reads build.options, the extra arguments of `docker build`, limited to the safe subset:
// --build-arg NAME=VALUE (taken as an arg; build.args wins on the same name) and --target NAME (build.target
// wins) are honoured; --pull, --no-cache, --progress, --label and --quiet are ignored; every other option
// (--network, --add-host, --secret, --ssh, --allow, --security-opt ...) is dropped and reported, since the
// build runs with sandkeep's own limits and no network.
func (p *parser) buildOptions(cfg *Config, opts []arg, target string) (map[string]string, string) {
	args := map[string]string{}
	for i := 0; i < len(opts); i++ {
		o := opts[i].s
		name, value, attached := strings.Cut(o, "=")
		takesValue := name == "--build-arg" || name == "--target" || name == "--label" || name == "--progress"
		if takesValue && !attached && i+1 < len(opts) {
			i++
			value = opts[i].s
		}
		switch name {
		case "--build-arg":
			k, v, ok := strings.Cut(value, "=")
			if !ok || k == "" {
				p.errorf(diag.DevcontainerValue, opts[i].off, "write --build-arg NAME=VALUE", "build.options %q is not NAME=VALUE", short(value))
				continue
			}
			args[k] = v
		case "--target":
			if target == "" {
				target = value
			}
		case "--pull", "--no-cache", "--progress", "--label", "--quiet", "-q":
		default:
			p.drop(cfg, opts[i].off, "build.options", o, "the build runs with sandkeep's own limits and without a network; only --build-arg and --target are taken")
		}
	}
	return args, target
}

// mountHasPathSource reports whether a mount without a type names a host path as its source (a bind) rather
// than a volume name or nothing (an anonymous volume, which sandkeep refuses as a bind without a source).
func mountHasPathSource(fields []string) bool {
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		switch strings.ToLower(k) {
		case "source", "src":
			return !namedVolume.MatchString(v)
		}
	}
	return true
}
