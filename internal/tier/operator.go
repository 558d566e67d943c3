// Package tier says what each tier of trust may set, and enforces it in one place. The operator (the server's
// config file, the CLI's flags and environment, library Config) decides secret sources and credential values,
// the host paths a repository may bind, and how far a repository may open the network: that is Operator. The
// repository (sandkeep.yaml, devcontainer.json; it may be a stranger's pull request) may only name what the
// operator defined and ask for what stays inside its envelope: Repository says what it may not set, as
// diagnostics (SK5xx) that name the tier, the field and the operator setting that would allow it. The caller
// tier (templates, narrower network blocks) is the admission pipeline's.
//
// The table this package enforces is docs/SECURITY.md's "Who may decide what".
package tier

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// The tiers, as diag.Diagnostic.Tier spells them.
const (
	NameOperator   = "operator"
	NameRepository = "repository"
	NameCaller     = "caller"
)

// Operator is what the operator lets a repository use or ask for. Its zero value allows a repository nothing
// beyond the repository-tier fields (image or build, env, post_create, tmpfs, read-only mounts inside the
// repository, allowlist host rules): no secrets, no credentials, no host paths, no host variables.
//
// It is meant to be embedded in the operator's config file; its YAML keys are snake_case and a decoder with
// KnownFields (ParseOperator) refuses unknown ones.
type Operator struct {
	// Secrets are the secret files a repository may ask for by name (secret_files: [{name: NAME, path: ...}]).
	Secrets map[string]SecretSource `yaml:"secrets,omitempty" json:"secrets,omitempty"`
	// Credentials are the network credentials a repository may ask for by name (credentials: [{name: NAME}]),
	// each with the hosts the egress proxy may send it to.
	Credentials map[string]CredentialSource `yaml:"credentials,omitempty" json:"credentials,omitempty"`
	// HostPaths are host directories a repository mount may come from besides the repository itself.
	HostPaths []string `yaml:"host_paths,omitempty" json:"host_paths,omitempty"`
	// RepoMountsWritable lets a repository's mounts be writable; otherwise they are made read-only (SK503).
	RepoMountsWritable bool `yaml:"repo_mounts_writable,omitempty" json:"repo_mounts_writable,omitempty"`
	// LocalEnv lists the host variables a devcontainer.json's ${localEnv:NAME} may read (never the deny class).
	LocalEnv []string `yaml:"local_env,omitempty" json:"local_env,omitempty"`
	// RepoNetworkOpen lets a repository choose network mode open or denylist, or a "**" rule.
	RepoNetworkOpen bool `yaml:"repo_network_open,omitempty" json:"repo_network_open,omitempty"`
	// RepoNetworkIPRules lets a repository allow IP addresses and CIDRs, not only host names.
	RepoNetworkIPRules bool `yaml:"repo_network_ip_rules,omitempty" json:"repo_network_ip_rules,omitempty"`

	// RepoBuilds is "refuse" to refuse every image build a repository asks for (a Dockerfile build, a
	// devcontainer feature, a compose companion's build: SK512), or "" / "allow". A build's RUN steps run as
	// root with the engine's capabilities and, on most engines, its default seccomp profile (the engine refuses
	// a build's seccomp option); `sandkeep doctor`'s "build limits" says what they get here.
	RepoBuilds string `yaml:"repo_builds,omitempty" json:"repo_builds,omitempty"`

	// FeatureRegistries are the registries (host or host:port) devcontainer features may come from whatever
	// their address: a registry on loopback, a private network or another refused range is refused otherwise,
	// and so is every redirect to one (issue 22, finding 6).
	FeatureRegistries []string `yaml:"feature_registries,omitempty" json:"feature_registries,omitempty"`

	// ImageRegistries are the registries (host or host:port; docker.io for Docker Hub's short names) the
	// engine may pull a repository-named image from: a repository's image (sandkeep.yaml, devcontainer.json, a
	// compose service) or a base its Dockerfile builds FROM (or COPY --from) that the engine does not have is
	// refused (SK514) before any pull unless its registry is listed here (issue 22, finding 6). The operator's
	// own images (Config.Image, templates) are pulled as before.
	ImageRegistries []string `yaml:"image_registries,omitempty" json:"image_registries,omitempty"`

	// LookupEnv reads the operator's environment for from_env sources; nil is os.LookupEnv. Tests inject it.
	LookupEnv func(name string) (string, bool) `yaml:"-" json:"-"`
}

// SecretSource is where the operator's secret's value comes from: exactly one of FromEnv (a variable of
// sandkeep's environment) and FromFile (an absolute host path, which must pass the mount guard's source rules).
type SecretSource struct {
	FromEnv  string `yaml:"from_env,omitempty" json:"from_env,omitempty"`
	FromFile string `yaml:"from_file,omitempty" json:"from_file,omitempty"`
}

// CredentialSource is the operator's network credential: the variable of sandkeep's environment that holds
// its value, and the egress rules of the hosts it may be sent to.
type CredentialSource struct {
	FromEnv string   `yaml:"from_env" json:"from_env"`
	Hosts   []string `yaml:"hosts" json:"hosts"`
	// Where the proxy puts the value, and nowhere else (see egress.Credential): Header ("" is Authorization),
	// after Scheme ("" is Bearer in Authorization), the Fields opted into by name (header:<Name>, form:<field>,
	// json:<member>), and plain http:// only with AllowPlaintext. All the operator's: a repository that sets any
	// of them is refused (SK506).
	Header         string   `yaml:"header,omitempty" json:"header,omitempty"`
	Scheme         string   `yaml:"scheme,omitempty" json:"scheme,omitempty"`
	Fields         []string `yaml:"fields,omitempty" json:"fields,omitempty"`
	AllowPlaintext bool     `yaml:"allow_plaintext,omitempty" json:"allow_plaintext,omitempty"`
}

// Operator.RepoBuilds' values.
const (
	RepoBuildsAllow  = "allow"
	RepoBuildsRefuse = "refuse"
)

// MaxOperatorSize bounds ParseOperator's input.
const MaxOperatorSize = 1 << 20

// ParseOperator decodes an Operator from YAML as DecodeOperator does and returns it with Validate's
// diagnostics. The error is set when the YAML cannot be decoded; the diagnostics may still hold errors (use
// List.Err).
func ParseOperator(data []byte) (op Operator, list diag.List, err error) {
	if err := DecodeOperator(data, &op); err != nil {
		return Operator{}, nil, fmt.Errorf("operator tier settings: %w", err)
	}
	return op, op.Validate(), nil
}

// DecodeOperator decodes the operator's YAML into v: an *Operator, or a pointer to a config file's struct that
// embeds Operator inline (sandkeep serve's sandkeep-server.yaml, which the CLI and the daemon read from
// $SANDKEEP_CONFIG too). It is strict, since the operator tier decides what every repository and caller may
// do and a setting that is read differently from how it was written is a hole: a YAML alias, a key given twice,
// a field v does not have and a second document are refused, each with its line. It checks no values (see
// Operator.Validate).
func DecodeOperator(data []byte, v any) (err error) {
	if len(data) > MaxOperatorSize {
		return fmt.Errorf("larger than %d bytes", MaxOperatorSize)
	}
	defer func() {
		if r := recover(); r != nil { // yaml.v3 has panicked on hostile input before
			err = errors.New("cannot be parsed as YAML")
		}
	}()
	// The document as a tree first: aliases (an alias expands where it is read, so what a reviewer sees at
	// one place is decided at another) and a second document, each with its line.
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if a := findAlias(&doc); a != nil {
		return fmt.Errorf("line %d: YAML alias *%s is not supported: write the value out", a.Line, a.Value)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return err
		}
		return fmt.Errorf("line %d: a second YAML document: the file holds one", extra.Line)
	}
	// Then into v: yaml.v3 refuses a key given twice and (KnownFields) a field v does not have, naming the line.
	strict := yaml.NewDecoder(bytes.NewReader(data))
	strict.KnownFields(true)
	if err := strict.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// findAlias returns the first alias node under n, or nil.
func findAlias(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode {
		return n
	}
	for _, c := range n.Content {
		if a := findAlias(c); a != nil {
			return a
		}
	}
	return nil
}

// Validate checks the operator's own values: secret and credential names, that each secret has exactly one
// source, that from_env names are environment variable names, that from_file paths and host_paths pass the
// mount guard's source rules (a path that does not exist yet is not an error here: it is checked again when
// used), that each credential has hosts that are valid, non-negated egress rules, and that local_env holds
// variable names. Each problem is a SK511 error with Tier "operator" and the field (secrets.NAME.from_file).
func (op Operator) Validate() diag.List {
	var list diag.List
	add := func(sev diag.Severity, field, hint, format string, args ...any) {
		list = append(list, diag.Diagnostic{Code: diag.TierOperatorInvalid, Severity: sev, Tier: NameOperator, Field: field,
			Message: "operator setting " + field + ": " + fmt.Sprintf(format, args...), Hint: hint})
	}
	for _, name := range sortedKeys(op.Secrets) {
		src, f := op.Secrets[name], "secrets."+name
		if !spec.ValidSecretName(name) {
			add(diag.Error, f, "name secrets with letters, digits, '.', '_' and '-' only", "%q is not a valid secret name", name)
		}
		const oneHint = "give exactly one of from_env: VAR and from_file: /abs/host/path"
		switch {
		case src.FromEnv == "" && src.FromFile == "":
			add(diag.Error, f, oneHint, "gives neither from_env nor from_file")
		case src.FromEnv != "" && src.FromFile != "":
			add(diag.Error, f, oneHint, "gives both from_env and from_file")
		case src.FromEnv != "":
			if !spec.ValidCredentialName(src.FromEnv) {
				add(diag.Error, f+".from_env", "name a variable of sandkeep's environment, e.g. from_env: NPM_RC", "%q is not an environment variable name", src.FromEnv)
			}
		default:
			if why := sourceRefused(src.FromFile); why != "" {
				add(diag.Error, f+".from_file", "name a regular file outside credential directories, by an absolute, clean path", "%s", why)
			}
		}
	}
	for _, name := range sortedKeys(op.Credentials) {
		cr, f := op.Credentials[name], "credentials."+name
		if !spec.ValidCredentialName(name) {
			add(diag.Error, f, "name it like an environment variable, e.g. GITHUB_TOKEN", "%q is not an environment variable name", name)
		}
		if !spec.ValidCredentialName(cr.FromEnv) {
			add(diag.Error, f+".from_env", "name the variable of sandkeep's environment that holds the value, e.g. from_env: GH_TOKEN", "%q is not an environment variable name", cr.FromEnv)
		}
		if len(cr.Hosts) == 0 {
			add(diag.Error, f+".hosts", "list the hosts it may be sent to, e.g. hosts: [api.github.com]", "names no host: the credential could go nowhere")
		}
		for i, h := range cr.Hosts {
			hf := fmt.Sprintf("%s.hosts[%d]", f, i)
			if _, err := egress.ParseRule(h); err != nil {
				var re *egress.RuleError
				hint := "write a host rule such as api.github.com or **.github.com"
				if errors.As(err, &re) && re.Hint != "" {
					hint = re.Hint
				}
				add(diag.Error, hf, hint, "%q is not a valid egress rule", h)
			} else if strings.HasPrefix(h, "!") {
				add(diag.Error, hf, "list only the hosts it may go to", "%q is negated", h)
			}
		}
	}
	for _, regs := range []struct {
		key  string
		list []string
	}{{"feature_registries", op.FeatureRegistries}, {"image_registries", op.ImageRegistries}} {
		for i, r := range regs.list {
			if !validRegistry(r) {
				add(diag.Error, fmt.Sprintf("%s[%d]", regs.key, i), "write a registry's host or host:port, e.g. ghcr.io or 127.0.0.1:5000", "%q is not a registry host", r)
			}
		}
	}
	switch op.RepoBuilds {
	case "", RepoBuildsAllow, RepoBuildsRefuse:
	default:
		add(diag.Error, "repo_builds", "write repo_builds: refuse, or allow (the default)", "%q is neither allow nor refuse", op.RepoBuilds)
	}
	for i, p := range op.HostPaths {
		f := fmt.Sprintf("host_paths[%d]", i)
		if why := sourceRefused(p); why != "" {
			add(diag.Error, f, "give an absolute, clean host directory that holds only what sandboxes may see", "%s", why)
		}
	}
	for i, name := range op.LocalEnv {
		f := fmt.Sprintf("local_env[%d]", i)
		switch {
		case !spec.ValidCredentialName(name):
			add(diag.Error, f, "list variable names, e.g. local_env: [NODE_VERSION]", "%q is not an environment variable name", name)
		case devcontainer.DenyClass(name) != "":
			add(diag.Warning, f, "remove it: pass such a value as a secret or credential instead",
				"%s is of the %s deny class, which a repository never reads whatever local_env says", name, devcontainer.DenyClass(name))
		}
	}
	return list
}

// sourceRefused says why p may not be read or bound from the host, by the mount guard's source rules, or "".
// A path that does not exist is not refused here (it is checked again when it is used).
func sourceRefused(p string) string {
	if !path.IsAbs(p) || path.Clean(p) != p {
		return fmt.Sprintf("%q is not an absolute, clean path", p)
	}
	err := guard.CheckMount(driver.Mount{Source: p, Target: secretSourceTarget, ReadOnly: true})
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	var fe *fault.Error
	if errors.As(err, &fe) {
		return fe.Message
	}
	return err.Error()
}

// secretSourceTarget is the target the guard checks a secret's source file against: a secret is never
// bound, but its source must be one that could be.
const secretSourceTarget = "/run/secrets-source"

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
