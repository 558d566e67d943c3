package lifecycle

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// Network is where a sandbox may connect to, as a caller writes it: a spec's network block, a library Config's,
// or one command's. ResolveNetwork turns it into the egress proxy's Policy.
type Network struct {
	Mode    string   // none (also ""), allowlist, denylist or open
	Preset  string   // a preset whose rules come before Rules ("default": common registries and source hosts)
	Rules   []string // egress rule syntax; last match wins
	Inherit string   // on a command's block: append (default: added to the sandbox's block) or replace
	// Credentials are secrets the sandbox only ever sees as a placeholder: the proxy puts the value in for
	// requests to the credential's hosts, and refuses a request to any other host that carries either.
	Credentials []Credential
	// Inspect is TLS inspection: "" or auto (on when there are credentials), on, or off.
	Inspect string
}

// Credential is one injected secret. Inside the sandbox the environment variable Name holds a placeholder.
type Credential struct {
	Name  string   // the environment variable the sandbox sees, e.g. GITHUB_TOKEN
	Value string   // the real secret: never in the sandbox, in events or in logs
	Hosts []string // egress rules (no negation) of the hosts it may go to

	// Where the value goes (see egress.Credential): Header ("" is Authorization) written with Scheme ("" is
	// Bearer in Authorization; none, Basic, token, ...), the Fields opted into by name (header:<Name>,
	// form:<field>, json:<member>), and plain http:// only with AllowPlaintext.
	Header         string
	Scheme         string
	Fields         []string
	AllowPlaintext bool
}

// Inherit values.
const (
	InheritAppend  = "append"
	InheritReplace = "replace"
)

// Presets are named rule lists. PresetDefault is built in; operators add their own (Config.NetworkPresets).
const PresetDefault = "default"

// defaultPreset: the package registries and source hosts that agents fetch from most.
var defaultPreset = []string{
	// Go
	"proxy.golang.org", "sum.golang.org", "index.golang.org",
	// JavaScript
	"registry.npmjs.org", "registry.yarnpkg.com", "repo.yarnpkg.com",
	// Python
	"pypi.org", "files.pythonhosted.org",
	// Rust
	"crates.io", "static.crates.io", "index.crates.io",
	// Ruby, Java, PHP, .NET
	"rubygems.org", "index.rubygems.org", "repo.maven.apache.org", "repo1.maven.org", "plugins.gradle.org",
	"services.gradle.org", "repo.packagist.org", "api.nuget.org",
	// Source hosts. Hosts that serve anyone's uploads as they are (storage.googleapis.com buckets,
	// raw.githubusercontent.com, objects.githubusercontent.com, gist.github.com) are left out: through them a
	// command could fetch, or with a writable bucket leave, anything. Operators add them in a preset of their own.
	"github.com", "api.github.com", "codeload.github.com", "gitlab.com", "bitbucket.org",
	// Distribution packages
	"deb.debian.org", "security.debian.org", "archive.ubuntu.com", "security.ubuntu.com", "dl-cdn.alpinelinux.org",
}

// MergeNetwork combines a sandbox's block with one command's. A nil side yields the other; replace takes the
// command's block as it is; append (the default) takes the command's mode, preset and inspection where it sets
// them and adds its rules after the sandbox's (so they win: last match wins) and its credentials.
func MergeNetwork(base, cmd *Network) (*Network, error) {
	if cmd == nil {
		return base, nil
	}
	switch cmd.Inherit {
	case "", InheritAppend:
	case InheritReplace:
		return cmd, nil
	default:
		return nil, fault.New(fault.NetworkInvalid, "write inherit: append (add to the sandbox's rules) or replace",
			"invalid network inherit %q", cmd.Inherit)
	}
	if base == nil {
		base = &Network{}
	}
	out := *base
	out.Rules = slices.Clone(base.Rules)
	out.Credentials = slices.Clone(base.Credentials)
	switch {
	case cmd.Mode != "":
		out.Mode = cmd.Mode
	case (out.Mode == "" || out.Mode == egress.ModeNone) && (len(cmd.Rules) > 0 || cmd.Preset != ""):
		// Rules added to a sandbox with no network mean "allow these": the only reading that does anything.
		out.Mode = egress.ModeAllowlist
	}
	if cmd.Inspect != "" {
		out.Inspect = cmd.Inspect
	}
	if cmd.Preset != "" && cmd.Preset != base.Preset {
		// Two presets: the command's rules come after the sandbox's, in the order written.
		out.Rules = append(out.Rules, "preset:"+cmd.Preset)
	}
	out.Rules = append(out.Rules, cmd.Rules...)
	for _, c := range cmd.Credentials {
		out.Credentials = slices.DeleteFunc(out.Credentials, func(o Credential) bool { return o.Name == c.Name })
		out.Credentials = append(out.Credentials, c)
	}
	return &out, nil
}

// ResolveNetwork checks n and returns the egress policy it stands for: the preset's rules, then n.Rules, parsed;
// silent are the hosts refused without an event. A nil n is mode none. Every refusal is NETWORK_INVALID, with
// the rule's diagnostic code in the message.
func ResolveNetwork(n *Network, presets map[string][]string, silent []string) (egress.Policy, error) {
	if n == nil {
		return egress.Policy{Mode: egress.ModeNone}, nil
	}
	mode := n.Mode
	switch mode {
	case "", egress.ModeNone:
		mode = egress.ModeNone
	case egress.ModeAllowlist, egress.ModeDenylist, egress.ModeOpen:
	default:
		return egress.Policy{}, fault.New(fault.NetworkInvalid, "use none, allowlist, denylist or open",
			"invalid network mode %q", n.Mode)
	}
	switch n.Inspect {
	case "", "auto", "on", "off":
	default:
		return egress.Policy{}, fault.New(fault.NetworkInvalid, "use auto (on when credentials are injected), on or off",
			"invalid TLS inspection setting %q", n.Inspect)
	}
	var raw []string
	if n.Preset != "" {
		rules, err := preset(n.Preset, presets)
		if err != nil {
			return egress.Policy{}, err
		}
		raw = append(raw, rules...)
	}
	for _, r := range n.Rules {
		if name, ok := strings.CutPrefix(r, "preset:"); ok {
			rules, err := preset(name, presets)
			if err != nil {
				return egress.Policy{}, err
			}
			raw = append(raw, rules...)
			continue
		}
		raw = append(raw, r)
	}
	rules, errs := egress.ParseRules(raw)
	if len(errs) > 0 {
		return egress.Policy{}, ruleError("network rule", errs[0])
	}
	creds, err := resolveCredentials(n.Credentials)
	if err != nil {
		return egress.Policy{}, err
	}
	if mode == egress.ModeNone && len(creds) > 0 {
		return egress.Policy{}, fault.New(fault.NetworkInvalid, "choose network mode allowlist (with the credentials' hosts) or remove the credentials",
			"credentials need a network: mode is none")
	}
	return egress.Policy{Mode: mode, Rules: rules, Silent: slices.Clone(silent), Credentials: creds, Inspect: n.Inspect}, nil
}

// NarrowNetwork is base (the run's resolved policy) narrowed by a caller's block cmd (egress.Narrow): a request
// passes only when both allow it. Credentials in cmd are refused (NetworkWidened) before anything is resolved:
// they are the operator's to give.
func NarrowNetwork(base egress.Policy, cmd *Network, presets map[string][]string) (egress.Policy, error) {
	if cmd == nil {
		return base, nil
	}
	if len(cmd.Credentials) > 0 {
		return egress.Policy{}, fault.New(fault.NetworkWidened, "ask for a subset of the template's hosts, or network mode none",
			"a caller's network block may only narrow the template's, and credentials are the operator's")
	}
	caller, err := ResolveNetwork(cmd, presets, nil)
	if err != nil {
		return egress.Policy{}, err
	}
	return egress.Narrow(base, caller)
}

func preset(name string, presets map[string][]string) ([]string, error) {
	if rules, ok := presets[name]; ok {
		return rules, nil
	}
	if name == PresetDefault {
		return defaultPreset, nil
	}
	known := slices.Sorted(maps.Keys(presets))
	if !slices.Contains(known, PresetDefault) {
		known = append([]string{PresetDefault}, known...)
	}
	return nil, fault.New(fault.NetworkInvalid, "use one of: "+strings.Join(known, ", ")+" (operators define presets in their config)",
		"unknown network preset %q", name)
}

func ruleError(what string, e *egress.RuleError) error {
	d := e.Diagnostic()
	return fault.New(fault.NetworkInvalid, d.Hint, "%s: %s: %s", what, d.Code, d.Message)
}

func resolveCredentials(in []Credential) ([]egress.Credential, error) {
	out := make([]egress.Credential, 0, len(in))
	seen := map[string]bool{}
	for _, c := range in {
		if !spec.ValidCredentialName(c.Name) {
			return nil, fault.New(fault.NetworkInvalid, "name it like an environment variable, e.g. GITHUB_TOKEN",
				"credential name %q is not an environment variable name", c.Name)
		}
		if seen[c.Name] {
			return nil, fault.New(fault.NetworkInvalid, "give each credential its own name", "credential %s is declared twice", c.Name)
		}
		seen[c.Name] = true
		if c.Value == "" {
			return nil, fault.New(fault.SecretUnavailable, "set the variable the credential is read from",
				"credential %s has no value", c.Name)
		}
		if len(c.Hosts) == 0 {
			return nil, fault.New(fault.NetworkInvalid, "list the hosts it may be sent to, e.g. hosts: [api.github.com]",
				"credential %s names no host", c.Name)
		}
		if err := egress.CheckCredentialPlacement(c.Header, c.Scheme, c.Fields); err != nil {
			var fe *fault.Error
			if errors.As(err, &fe) {
				return nil, fault.Wrap(err, fault.NetworkInvalid, fe.Hint, "credential %s: %s", c.Name, fe.Message)
			}
			return nil, err
		}
		hosts, errs := egress.ParseRules(c.Hosts)
		if len(errs) > 0 {
			return nil, ruleError(fmt.Sprintf("credential %s host", c.Name), errs[0])
		}
		for _, h := range hosts {
			if h.Negate {
				return nil, fault.New(fault.NetworkInvalid, "list only the hosts it may go to",
					"credential %s: host %q is negated", c.Name, h.String())
			}
		}
		out = append(out, egress.Credential{Name: c.Name, Value: c.Value, Hosts: hosts,
			Header: c.Header, Scheme: c.Scheme, Fields: slices.Clone(c.Fields), AllowPlaintext: c.AllowPlaintext})
	}
	return out, nil
}
