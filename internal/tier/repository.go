package tier

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// Sources says which files a repository-tier sandbox block was fused from, so that Repository's diagnostics
// carry the file, line and column a field was written at. Either may be nil.
type Sources struct {
	Spec         *spec.File           // sandkeep.yaml, from spec.Load or spec.Parse
	Devcontainer *devcontainer.Config // devcontainer.json, from devcontainer.Load or devcontainer.Parse
	// CompanionBuilds are the compose companions (runServices) that are built from a Dockerfile, by service
	// name; the sandbox's own service's build is sb.Build.
	CompanionBuilds []string
}

// Repository checks a repository-tier sandbox block (the spec fused with devcontainer.json, before the
// operator's overlay is laid over it) against what op allows, and returns a diagnostic for each thing the
// repository may not set; see RepositoryFrom, which places them in their files.
func Repository(sb *spec.Sandbox, root string, op Operator) diag.List {
	return RepositoryFrom(sb, root, op, Sources{})
}

// RepositoryFrom is Repository with the files sb was fused from, for positions. It refuses (errors, each
// with Tier "repository", the Field and a Hint naming the operator setting that would allow it):
//
//	SK500 mode: none                      a repository may raise isolation, never lower it
//	SK501 user                            the sandbox's uid:gid is the operator's
//	SK502 a mount from outside root       unless under one of HostPaths; resolved without following links out
//	SK504 secret_files from_env/from_file a source is the operator's (Secrets)
//	SK505 a secret name not in Secrets
//	SK506 credentials from_env or hosts   a value and its hosts are the operator's (Credentials)
//	SK507 a credential name not in Credentials
//	SK508 network mode open or denylist, or a "**" rule, unless RepoNetworkOpen
//	SK509 an allowing IP or CIDR rule, unless RepoNetworkIPRules
//	SK510 host_state: auto
//	SK512 a build, a feature or a companion build, when RepoBuilds is "refuse"
//	SK513 services or host_services       host services are the operator's to register and offer
//
// A writable mount, unless RepoMountsWritable, is made read-only in sb (its string rewritten) with a SK503
// warning rather than refused: the rule is "read-only unless the operator allows writes", and a
// devcontainer.json's binds are writable by default, so refusing would reject most real files over a flag
// their authors never thought about; read-only keeps the posture the operator chose. This is the only change
// Repository makes to sb. Fields sb does not set are not checked; fields the spec and devcontainer parsers
// check (mount deny-lists, env deny class, build paths) are not checked again here.
func RepositoryFrom(sb *spec.Sandbox, root string, op Operator, src Sources) diag.List {
	if sb == nil {
		return nil
	}
	c := &repoCheck{op: op, src: src}
	if root != "" {
		if abs, err := filepath.Abs(root); err == nil {
			root = abs
		}
	}
	if sb.Mode == spec.ModeNone {
		c.specErr(diag.TierModeNone, "sandbox.mode",
			"remove mode: none from the repository's files (or write auto or inline); running without a sandbox is the operator's choice: SANDKEEP_SANDBOX_DEFAULT=none or --sandbox none",
			"the repository sets sandbox.mode to none: a repository may raise isolation, never lower it")
	}
	if sb.User != "" {
		c.user(sb.User)
	}
	for i := range sb.Mounts {
		c.mount(sb, i, root)
	}
	if sb.HostState == "auto" {
		c.specErr(diag.TierHostState, "sandbox.host_state",
			"remove host_state from the repository's files (or write host_state: none); binding host state is the operator's to set, in the operator's own overlay",
			"the repository sets sandbox.host_state to auto: host state is bound in only by the operator")
	}
	if len(sb.HostServices) > 0 {
		c.specErr(diag.TierHostServices, "sandbox.host_services",
			"remove host_services from the repository's files; host services are registered by the operator (host_services in the operator's config)",
			"the repository registers host services %s: only the operator may", strings.Join(sb.HostServices, ", "))
	}
	if len(sb.Services) > 0 {
		c.specErr(diag.TierHostServices, "sandbox.services",
			"remove services from the repository's files; the operator offers host services through a template (services: [NAME])",
			"the repository asks for host services %s: only an operator's template may offer them", strings.Join(sb.Services, ", "))
	}
	for i, sf := range sb.SecretFiles {
		c.secret(i, sf)
	}
	if sb.Network != nil {
		c.network(sb.Network)
	}
	if op.RepoBuilds == RepoBuildsRefuse {
		c.builds(sb)
	}
	return c.list
}

// builds refuses every image build the repository asks for: its RUN steps, a feature's install.sh and a
// companion's build run as root under the engine's own seccomp profile (issue 22, finding 3).
func (c *repoCheck) builds(sb *spec.Sandbox) {
	const hint = "name a prebuilt image (image: ...) instead; the operator refuses repository builds here (repo_builds: refuse)"
	if sb.Build != nil {
		file, line, col, field := "", 0, 0, "sandbox.build"
		if dc := c.src.Devcontainer; dc != nil && dc.Build != nil {
			line, col = dc.Pos("build")
			file, field = dc.Path, "build"
		} else {
			file, line, col = c.inSpec(field)
		}
		c.add(diag.Error, diag.TierBuildRefused, file, line, col, field, hint,
			"the repository asks for an image build: the operator refuses repository builds")
	}
	if dc := c.src.Devcontainer; dc != nil && len(dc.Features) > 0 {
		line, col := dc.Pos("features")
		c.add(diag.Error, diag.TierBuildRefused, dc.Path, line, col, "features", "remove the features (bake them into a prebuilt image); the operator refuses repository builds here (repo_builds: refuse)",
			"the repository asks for %d devcontainer feature(s), each installed by an image build: the operator refuses repository builds", len(dc.Features))
	}
	for _, svc := range c.src.CompanionBuilds {
		c.add(diag.Error, diag.TierBuildRefused, "", 0, 0, "services."+svc+".build", hint,
			"the compose companion %s is built from a Dockerfile: the operator refuses repository builds", svc)
	}
}

// repoCheck collects one RepositoryFrom's diagnostics.
type repoCheck struct {
	op   Operator
	src  Sources
	list diag.List
}

// add appends a diagnostic at file:line:col.
func (c *repoCheck) add(sev diag.Severity, code diag.Code, file string, line, col int, field, hint, format string, args ...any) {
	c.list = append(c.list, diag.Diagnostic{Code: code, Severity: sev, File: file, Line: line, Column: col,
		Tier: NameRepository, Field: field, Message: fmt.Sprintf(format, args...), Hint: hint})
}

// specErr reports an error on a field only the spec file has (devcontainer.json has no mode, secrets,
// network or host_state).
func (c *repoCheck) specErr(code diag.Code, field, hint, format string, args ...any) {
	file, line, col := c.inSpec(field)
	c.add(diag.Error, code, file, line, col, field, hint, format, args...)
}

func (c *repoCheck) inSpec(field string) (file string, line, col int) {
	if c.src.Spec == nil {
		return "", 0, 0
	}
	line, col = c.src.Spec.Pos(field)
	return c.src.Spec.Path, line, col
}

func (c *repoCheck) user(u string) {
	const hint = "remove the user from the repository's files; the operator sets the sandbox's uid:gid (SANDKEEP_SANDBOX_USER, or Config.User in the library)"
	if dc := c.src.Devcontainer; dc != nil && dc.User == u {
		field := "containerUser"
		if l, _ := dc.Pos("remoteUser"); l > 0 {
			field = "remoteUser"
		}
		line, col := dc.Pos("user")
		c.add(diag.Error, diag.TierUser, dc.Path, line, col, field, hint,
			"devcontainer.json sets %s %q: the repository may not choose the sandbox's user", field, u)
		return
	}
	c.specErr(diag.TierUser, "sandbox.user", hint, "the repository sets sandbox.user %q: the repository may not choose the sandbox's user", u)
}

// where finds the file, position and field a fused mount came from: the spec's mounts come first, then
// devcontainer.json's (Fuse's order).
func (c *repoCheck) where(m string, i int) (file string, line, col int, field string) {
	if f := c.src.Spec; f != nil {
		for j, sm := range f.Sandbox.Mounts {
			if sm == m {
				field = fmt.Sprintf("sandbox.mounts[%d]", j)
				line, col = f.Pos(field)
				return f.Path, line, col, field
			}
		}
	}
	if dc := c.src.Devcontainer; dc != nil {
		for k, dm := range dc.Mounts {
			if dm == m {
				line, col = dc.Pos(fmt.Sprintf("mounts[%d]", k))
				return dc.Path, line, col, fmt.Sprintf("mounts[%d]", k)
			}
		}
	}
	return "", 0, 0, fmt.Sprintf("sandbox.mounts[%d]", i)
}

// mount checks sb.Mounts[i]: its source must resolve inside root or one of the operator's host paths, and it
// is made read-only unless the operator allows writes.
func (c *repoCheck) mount(sb *spec.Sandbox, i int, root string) {
	m := sb.Mounts[i]
	file, line, col, field := c.where(m, i)
	mt, ok := parseMount(m)
	if !ok {
		c.add(diag.Error, diag.TierMountOutside, file, line, col, field,
			"write it as type=bind,source=/abs/path/inside/the/repository,target=/workspace/dir,readonly",
			"repository mount %s cannot be read, so its source cannot be shown to be inside the repository", field)
		return
	}
	inRoot, whyRoot := false, "has no repository to be inside"
	switch why := rootRefused(root); {
	case root == "":
	case why != "":
		whyRoot = "is taken as outside the repository because the repository root " + why
	default:
		inRoot, whyRoot = within(root, mt.source)
	}
	if !inRoot {
		allowed := false
		for _, hp := range c.op.HostPaths {
			if sourceRefused(hp) != "" {
				continue // Validate reports it; a host path the guard refuses (/, a home) holds nothing
			}
			if ok, _ := within(hp, mt.source); ok {
				allowed = true
				break
			}
		}
		if !allowed {
			resolved := mt.source
			if r, err := filepath.EvalSymlinks(mt.source); err == nil {
				resolved = r // host_paths must name where a link leads, not the link
			}
			c.add(diag.Error, diag.TierMountOutside, file, line, col, field,
				fmt.Sprintf("bind a directory inside the repository, or add %s (or a directory above it) to host_paths in the operator config", resolved),
				"repository mount %s has source %q, which %s, and no operator host path (host_paths) holds it", field, mt.source, whyRoot)
			return
		}
	}
	if !mt.readOnly && !c.op.RepoMountsWritable {
		sb.Mounts[i] = mt.readOnlyString()
		c.add(diag.Warning, diag.TierMountWritable, file, line, col, field,
			"add readonly to the mount to silence this, or set repo_mounts_writable: true in the operator config to let repository mounts be writable",
			"repository mount %s (source %q) is writable; it is made read-only", field, mt.source)
	}
}

// rootRefused says why root may not stand for "inside the repository", or "": it must itself be a source the
// mount guard would bind. A spec in a home directory (which holds .ssh) or at / would otherwise make every
// file under it, ~/.bashrc included, "inside the repository".
func rootRefused(root string) string {
	if root == "" {
		return ""
	}
	if why := sourceRefused(root); why != "" {
		return "is refused by the mount guard: " + why
	}
	if _, err := os.Stat(root); err != nil {
		return "cannot be read"
	}
	return ""
}

// within reports whether p, resolved, is base or beneath it, without following any link out of base: p is
// opened through an os.Root at base (which refuses a symlink or ".." that leaves it), and the fully resolved
// paths are compared as well. why says why not, for the message.
func within(base, p string) (ok bool, why string) {
	base = filepath.Clean(base)
	rel, err := filepath.Rel(base, p)
	if err != nil || !filepath.IsLocal(rel) && rel != "." {
		// p may name base through a link to it (or base may be a link): compare resolved paths.
		rb, err1 := filepath.EvalSymlinks(base)
		if err1 != nil {
			return false, "is not inside the repository"
		}
		if rel, err = filepath.Rel(rb, p); err != nil || !filepath.IsLocal(rel) && rel != "." {
			return false, "is not inside the repository"
		}
		base = rb
	}
	r, err := os.OpenRoot(base)
	if err != nil {
		return false, "cannot be checked: the repository root cannot be opened"
	}
	defer r.Close()
	if _, err := r.Stat(rel); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, "does not exist inside the repository (a path that cannot be checked is refused)"
		}
		return false, "resolves through a symbolic link that leaves the repository (or is absolute)"
	}
	rb, err1 := filepath.EvalSymlinks(base)
	rp, err2 := filepath.EvalSymlinks(p)
	if err1 != nil || err2 != nil {
		return false, "cannot be resolved"
	}
	if rel, err := filepath.Rel(rb, rp); err != nil || !filepath.IsLocal(rel) && rel != "." {
		return false, "leaves the repository through a symbolic link"
	}
	return true, ""
}

// mountParts is what Repository reads of a --mount string: the guard checked the rest.
type mountParts struct {
	source, target string
	readOnly       bool
}

// parseMount reads source, target and readonly from a --mount string (keys as guard.ParseMount accepts them).
func parseMount(m string) (mountParts, bool) {
	var mp mountParts
	for _, f := range strings.Split(m, ",") {
		k, v, hasValue := strings.Cut(f, "=")
		switch strings.ToLower(k) {
		case "source", "src":
			mp.source = v
		case "target", "dst", "destination":
			mp.target = v
		case "readonly", "ro":
			switch {
			case !hasValue || v == "true" || v == "1":
				mp.readOnly = true
			case v == "false" || v == "0":
			default:
				return mp, false
			}
		case "type":
			if !strings.EqualFold(v, "bind") {
				return mp, false
			}
		default:
			return mp, false
		}
	}
	return mp, mp.source != "" && mp.target != "" && filepath.IsAbs(mp.source)
}

func (mp mountParts) readOnlyString() string {
	return "type=bind,source=" + mp.source + ",target=" + mp.target + ",readonly"
}

func (c *repoCheck) secret(i int, sf spec.SecretFile) {
	f := fmt.Sprintf("sandbox.secret_files[%d]", i)
	if sf.FromEnv != "" {
		c.specErr(diag.TierSecretSource, f+".from_env", defineSecretHint(sf.Name),
			"the repository gives secret %q a source (from_env %s): only the operator may say where a secret's value comes from", sf.Name, sf.FromEnv)
	}
	if sf.FromFile != "" {
		c.specErr(diag.TierSecretSource, f+".from_file", defineSecretHint(sf.Name),
			"the repository gives secret %q a source (from_file %s): only the operator may say where a secret's value comes from", sf.Name, sf.FromFile)
	}
	if sf.FromEnv == "" && sf.FromFile == "" {
		if _, ok := c.op.Secrets[sf.Name]; !ok {
			c.specErr(diag.TierSecretUnknown, f+".name", defineSecretHint(sf.Name),
				"the repository asks for secret %q, which the operator has not defined", sf.Name)
		}
	}
}

func (c *repoCheck) network(n *spec.Network) {
	switch n.Mode {
	case "open", "denylist":
		if !c.op.RepoNetworkOpen {
			c.specErr(diag.TierNetworkOpen, "sandbox.network.mode",
				"use mode: allowlist with the hosts the project needs, or set repo_network_open: true in the operator config",
				"the repository sets network mode %s, which lets the sandbox reach hosts nobody listed", n.Mode)
		}
	}
	for i, s := range n.Rules {
		f := fmt.Sprintf("sandbox.network.rules[%d]", i)
		r, err := egress.ParseRule(s)
		if err != nil || r.Negate {
			continue // a bad rule is the spec parser's (SK3xx); a negated one only narrows
		}
		switch {
		case r.Wildcard == egress.All && !c.op.RepoNetworkOpen && n.Mode != "open" && n.Mode != "denylist":
			c.specErr(diag.TierNetworkOpen, f,
				"list the hosts the project needs (e.g. **.github.com), or set repo_network_open: true in the operator config",
				"the repository's network rule %q allows every host", s)
		case (r.IP.IsValid() || r.Prefix.IsValid()) && !c.op.RepoNetworkIPRules:
			// In every mode: an allowing IP or CIDR rule is what unlocks a refused address class (loopback,
			// private, metadata), so under open or denylist it is not "nothing added".
			c.specErr(diag.TierNetworkIPRule, f,
				"name hosts instead of addresses, or set repo_network_ip_rules: true in the operator config",
				"the repository's network rule %q allows an IP address or range", s)
		}
	}
	for i, cr := range n.Credentials {
		f := fmt.Sprintf("sandbox.network.credentials[%d]", i)
		if cr.FromEnv != "" {
			c.specErr(diag.TierCredentialSource, f+".from_env", defineCredentialHint(cr.Name),
				"the repository gives credential %s a source (from_env %s): only the operator may say where a credential's value comes from", cr.Name, cr.FromEnv)
		}
		if cr.Hosts != nil {
			c.specErr(diag.TierCredentialSource, f+".hosts", defineCredentialHint(cr.Name),
				"the repository names the hosts credential %s is sent to: only the operator may", cr.Name)
		}
		for _, set := range []struct {
			on    bool
			field string
		}{{cr.Header != "", "header"}, {cr.Scheme != "", "scheme"}, {cr.Fields != nil, "fields"}, {cr.AllowPlaintext, "allow_plaintext"}} {
			if set.on {
				c.specErr(diag.TierCredentialSource, f+"."+set.field, defineCredentialHint(cr.Name),
					"the repository says where credential %s is put (%s): only the operator may", cr.Name, set.field)
			}
		}
		if cr.FromEnv == "" && cr.Hosts == nil {
			if _, ok := c.op.Credentials[cr.Name]; !ok {
				c.specErr(diag.TierCredentialUnknown, f+".name", defineCredentialHint(cr.Name),
					"the repository asks for credential %s, which the operator has not defined", cr.Name)
			}
		}
	}
}
