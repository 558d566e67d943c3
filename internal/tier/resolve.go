package tier

import (
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"slices"

	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// MaxSecretFile bounds a secret read from a host file.
const MaxSecretFile = 1 << 20

// ResolvedSecret is a secret file with the operator's value, ready to be placed on the sandbox's secrets
// tmpfs. Its String, GoString and LogValue never show Value.
type ResolvedSecret struct {
	Name  string
	Path  string      // under spec.SecretsDir
	Mode  fs.FileMode // spec.DefaultSecretMode when the entry gave none
	Value []byte
}

// ResolvedCredential is a network credential with the operator's value and hosts, for the egress proxy only.
// Its String, GoString and LogValue never show Value.
type ResolvedCredential struct {
	Name  string   // the variable the sandbox sees a placeholder in
	Value string   // never in the sandbox
	Hosts []string // the operator's egress rules for it
	// Where the value goes: the operator's CredentialSource fields.
	Header, Scheme string
	Fields         []string
	AllowPlaintext bool
}

func (s ResolvedSecret) String() string {
	return fmt.Sprintf("secret %s at %s (%d bytes)", s.Name, s.Path, len(s.Value))
}
func (s ResolvedSecret) GoString() string { return "tier.ResolvedSecret{" + s.String() + "}" }

// LogValue keeps the value out of slog output.
func (s ResolvedSecret) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", s.Name), slog.String("path", s.Path), slog.Int("bytes", len(s.Value)))
}

func (c ResolvedCredential) String() string {
	return fmt.Sprintf("credential %s for %v", c.Name, c.Hosts)
}
func (c ResolvedCredential) GoString() string { return "tier.ResolvedCredential{" + c.String() + "}" }

// LogValue keeps the value out of slog output.
func (c ResolvedCredential) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", c.Name), slog.Any("hosts", c.Hosts))
}

func (op Operator) lookupEnv(name string) (string, bool) {
	if op.LookupEnv != nil {
		return op.LookupEnv(name)
	}
	return os.LookupEnv(name)
}

// ResolveSecrets returns the operator's values for the secret files a repository referenced by name, in
// order. An entry that brings its own source (from_env, from_file) is refused: the source must be in
// Secrets (Repository reports it as SK504 before this is called). from_env reads the operator's environment
// (LookupEnv); from_file reads a host file of at most MaxSecretFile bytes that passes the mount guard's source
// rules. Every failure is a *fault.Error with SECRET_UNAVAILABLE (or SPEC_INVALID for a bad mode) that names
// the secret and never its value.
func (op Operator) ResolveSecrets(files []spec.SecretFile) ([]ResolvedSecret, error) {
	out := make([]ResolvedSecret, 0, len(files))
	for _, sf := range files {
		if sf.FromEnv != "" || sf.FromFile != "" {
			return nil, fault.New(fault.SecretUnavailable, defineSecretHint(sf.Name),
				"secret %q brings its own source; only secrets the operator defined are delivered", sf.Name)
		}
		src, ok := op.Secrets[sf.Name]
		if !ok {
			return nil, fault.New(fault.SecretUnavailable, defineSecretHint(sf.Name),
				"secret %q is not defined by the operator", sf.Name)
		}
		mode, err := spec.ParseSecretMode(sf.Mode)
		if err != nil {
			return nil, fault.Wrap(err, fault.SpecInvalid, `write the mode in octal, e.g. "0400"`, "secret %q: mode", sf.Name)
		}
		var value []byte
		switch {
		case src.FromEnv != "" && src.FromFile == "":
			v, ok := op.lookupEnv(src.FromEnv)
			if !ok {
				return nil, fault.New(fault.SecretUnavailable, "set "+src.FromEnv+" in sandkeep's environment",
					"secret %q: the operator's environment variable %s is not set", sf.Name, src.FromEnv)
			}
			value = []byte(v)
		case src.FromFile != "" && src.FromEnv == "":
			if value, err = readSecretFile(sf.Name, src.FromFile); err != nil {
				return nil, err
			}
		default:
			return nil, fault.New(fault.SecretUnavailable, "give the operator's secret exactly one of from_env and from_file",
				"secret %q: the operator's definition has no single source", sf.Name)
		}
		out = append(out, ResolvedSecret{Name: sf.Name, Path: sf.Path, Mode: mode, Value: value})
	}
	return out, nil
}

// readSecretFile reads the operator's secret file at p, which must pass the mount guard's source rules (a
// misconfigured operator entry must not hand out ~/.ssh/id_rsa either).
func readSecretFile(name, p string) ([]byte, error) {
	if why := sourceRefused(p); why != "" {
		return nil, fault.New(fault.SecretUnavailable, "name a file outside credential directories, or pass the value with from_env",
			"secret %q: its source file is refused (%s)", name, why)
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, fault.Wrap(err, fault.SecretUnavailable, "check the operator's from_file path and its permissions", "secret %q: cannot read its file", name)
	}
	defer f.Close()
	if info, err := f.Stat(); err != nil || !info.Mode().IsRegular() {
		return nil, fault.New(fault.SecretUnavailable, "name a regular file", "secret %q: its source is not a regular file", name)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSecretFile+1))
	if err != nil || len(b) > MaxSecretFile {
		return nil, fault.New(fault.SecretUnavailable, "keep secret files under 1 MiB", "secret %q: cannot read its file, or it is over 1 MiB", name)
	}
	return b, nil
}

// ResolveCredentials returns the operator's values and hosts for the network credentials a repository
// referenced by name, in order. An entry with its own from_env or hosts is refused (Repository reports it as
// SK506); a name the operator did not define, or whose variable is unset or empty, is SECRET_UNAVAILABLE.
// Errors name the credential and the variable, never the value.
func (op Operator) ResolveCredentials(refs []spec.NetworkCredential) ([]ResolvedCredential, error) {
	out := make([]ResolvedCredential, 0, len(refs))
	for _, ref := range refs {
		if ref.FromEnv != "" || ref.Hosts != nil {
			return nil, fault.New(fault.SecretUnavailable, defineCredentialHint(ref.Name),
				"credential %s brings its own source or hosts; only credentials the operator defined are injected", ref.Name)
		}
		src, ok := op.Credentials[ref.Name]
		if !ok {
			return nil, fault.New(fault.SecretUnavailable, defineCredentialHint(ref.Name),
				"credential %s is not defined by the operator", ref.Name)
		}
		if len(src.Hosts) == 0 {
			return nil, fault.New(fault.SecretUnavailable, "list the hosts it may be sent to in the operator config (credentials: "+ref.Name+": {hosts: [...]})",
				"credential %s: the operator's definition names no host", ref.Name)
		}
		v, _ := op.lookupEnv(src.FromEnv)
		if v == "" {
			return nil, fault.New(fault.SecretUnavailable, "export "+src.FromEnv+" in sandkeep's environment",
				"credential %s: the operator's environment variable %s is not set", ref.Name, src.FromEnv)
		}
		out = append(out, ResolvedCredential{Name: ref.Name, Value: v, Hosts: slices.Clone(src.Hosts),
			Header: src.Header, Scheme: src.Scheme, Fields: slices.Clone(src.Fields), AllowPlaintext: src.AllowPlaintext})
	}
	return out, nil
}

// LocalEnvLookup is the lookup devcontainer expansion gets: only the names in LocalEnv reach lookup (nil:
// none is set); every other name is missing. Prefer DevcontainerEnv, which also makes an unlisted name a SK217
// warning instead of a silent "".
func (op Operator) LocalEnvLookup(lookup func(string) (string, bool)) func(string) (string, bool) {
	listed := op.localEnvSet()
	return func(name string) (string, bool) {
		if !listed[name] || lookup == nil {
			return "", false
		}
		return lookup(name)
	}
}

// LocalEnvListed reports whether the operator lists name in LocalEnv.
func (op Operator) LocalEnvListed(name string) bool { return slices.Contains(op.LocalEnv, name) }

// DevcontainerEnv is the devcontainer.Env for a repository at workspaceFolder: ${localEnv:NAME} reads lookup
// only for names in LocalEnv, and reports any other name as SK217.
func (op Operator) DevcontainerEnv(lookup func(string) (string, bool), workspaceFolder string) devcontainer.Env {
	listed := op.localEnvSet()
	return devcontainer.Env{
		Lookup:          op.LocalEnvLookup(lookup),
		WorkspaceFolder: workspaceFolder,
		Listed:          func(name string) bool { return listed[name] },
	}
}

func (op Operator) localEnvSet() map[string]bool {
	set := make(map[string]bool, len(op.LocalEnv))
	for _, n := range op.LocalEnv {
		set[n] = true
	}
	return set
}

func defineSecretHint(name string) string {
	return fmt.Sprintf("define the secret in the operator config (secrets: {%s: {from_env: VAR}} or {from_file: /abs/path}) and reference it by name: {name: %s, path: %s/%s}",
		name, name, spec.SecretsDir, name)
}

func defineCredentialHint(name string) string {
	return fmt.Sprintf("define the credential in the operator config (credentials: {%s: {from_env: VAR, hosts: [api.example.com]}}) and reference it by name only: {name: %s}", name, name)
}
