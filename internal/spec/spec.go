// Package spec reads sandkeep.yaml, a project's description of its sandbox, strictly: unknown fields are errors
// and every problem is a diag.Diagnostic with a stable code, the file, the line and a fix hint.
package spec

import "gopkg.in/yaml.v3"

// Modes. ModeInherit ("") defers to the next tier; only ModeAuto and ModeInline are active.
const (
	ModeInherit = ""
	ModeNone    = "none"
	ModeAuto    = "auto"
	ModeInline  = "inline"
)

// File is a parsed sandkeep.yaml.
type File struct {
	Path    string  // the file as given
	Root    string  // its directory: the repository root, where devcontainer.json is looked up
	Sandbox Sandbox // the `sandbox:` block

	pos map[string]*yaml.Node // the node each field path was read from (see checker.pos); nil for a File made by hand
}

// Pos returns the 1-based line and column in the file where field (a path such as "sandbox.mounts[1]" or
// "sandbox.network.credentials[0].hosts") was written, or of its nearest enclosing field that was; 0, 0 when
// none was (a File not made by Parse, or a field the file does not set).
func (f *File) Pos(field string) (line, col int) {
	if f == nil {
		return 0, 0
	}
	n := (&checker{pos: f.pos}).node(field)
	if n == nil {
		return 0, 0
	}
	return n.Line, n.Column
}

// Sandbox is what a sandbox should be. Zero fields are unset (the next source, or the default, decides).
type Sandbox struct {
	Mode            string            `yaml:"mode" json:"mode,omitempty"`
	Image           string            `yaml:"image" json:"image,omitempty"`
	Build           *Build            `yaml:"build" json:"build,omitempty"`
	User            string            `yaml:"user" json:"user,omitempty"`
	Env             map[string]string `yaml:"env" json:"env,omitempty"`
	Mounts          []string          `yaml:"mounts" json:"mounts,omitempty"`
	Tmpfs           []string          `yaml:"tmpfs" json:"tmpfs,omitempty"`
	Resources       *Resources        `yaml:"resources" json:"resources,omitempty"`
	PostCreate      string            `yaml:"post_create" json:"post_create,omitempty"`
	WorkspaceFolder string            `yaml:"workspace_folder" json:"workspace_folder,omitempty"`
	HostState       string            `yaml:"host_state" json:"host_state,omitempty"` // "auto" | "none"
	SecretFiles     []SecretFile      `yaml:"secret_files" json:"secret_files,omitempty"`
	Network         *Network          `yaml:"network" json:"network,omitempty"`
	// Services and HostServices (names) are the operator's to set: a repository's are refused (tier.Repository).
	Services     []string `yaml:"services" json:"services,omitempty"`
	HostServices []string `yaml:"host_services" json:"host_services,omitempty"`

	// From devcontainer.json only (sandkeep.yaml has no spelling for them; Fuse sets them).
	Volumes      []Volume `yaml:"-" json:"volumes,omitempty"`       // named volumes the sandbox owns
	PostStart    string   `yaml:"-" json:"post_start,omitempty"`    // sh -c at every start of the sandbox, after PostCreate on the first
	PostAttach   string   `yaml:"-" json:"post_attach,omitempty"`   // sh -c before the first command of each run
	ForwardPorts []string `yaml:"-" json:"forward_ports,omitempty"` // recorded for port forwarding; nothing is published
}

// Volume is a named volume owned by one sandbox: the engine's volume is named after the key and Name, made
// with the sandbox and removed with it (never shared between keys). Name "" is keyed by the target.
type Volume struct {
	Name     string `json:"name,omitempty"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readonly,omitempty"`
}

// Build builds the sandbox's image from a Dockerfile; paths are relative to the repository root.
type Build struct {
	Dockerfile string            `yaml:"dockerfile" json:"dockerfile,omitempty"`
	Context    string            `yaml:"context" json:"context,omitempty"`
	Args       map[string]string `yaml:"args" json:"args,omitempty"`
	Target     string            `yaml:"target" json:"target,omitempty"` // the stage to build; "" is the last
}

// Resources bound the sandbox. Memory and Disk are sizes ("2g", "512m"). Disk and Inodes bound the workspace
// with a file system of its own (docs/SECURITY.md, "Disk").
type Resources struct {
	CPUs   float64 `yaml:"cpus" json:"cpus,omitempty"`
	Memory string  `yaml:"memory" json:"memory,omitempty"`
	Pids   int64   `yaml:"pids" json:"pids,omitempty"`
	Disk   string  `yaml:"disk" json:"disk,omitempty"`
	Inodes int64   `yaml:"inodes" json:"inodes,omitempty"`
}

// SecretFile is a secret delivered as a file on a tmpfs inside the sandbox, never as an environment variable.
// At most one of FromEnv and FromFile names where the value comes from; with neither, the entry refers to the
// secret the operator defined under Name (a repository may only refer: see internal/tier).
type SecretFile struct {
	Name     string `yaml:"name" json:"name"`
	Path     string `yaml:"path" json:"path"`
	FromEnv  string `yaml:"from_env" json:"from_env,omitempty"`
	FromFile string `yaml:"from_file" json:"from_file,omitempty"`
	Mode     string `yaml:"mode" json:"mode,omitempty"` // octal, default "0400"
}

// Network is the sandbox's egress policy (enforced by the egress capability).
type Network struct {
	Mode    string   `yaml:"mode" json:"mode,omitempty"`       // none | allowlist | denylist | open
	Preset  string   `yaml:"preset" json:"preset,omitempty"`   // e.g. "default"
	Rules   []string `yaml:"rules" json:"rules,omitempty"`     // see internal/egress rule syntax
	Inherit string   `yaml:"inherit" json:"inherit,omitempty"` // append | replace
	// Credentials are injected by the egress proxy: the sandbox sees a placeholder in $name.
	Credentials []NetworkCredential `yaml:"credentials" json:"credentials,omitempty"`
	Inspect     string              `yaml:"inspect" json:"inspect,omitempty"` // TLS inspection: auto | on | off
}

// NetworkCredential is a secret read on the host (from_env) that may go only to hosts. With only Name set
// (FromEnv empty, Hosts nil), it refers to the credential the operator defined under Name (a repository may
// only refer: see internal/tier).
type NetworkCredential struct {
	Name    string   `yaml:"name" json:"name"`         // the environment variable the sandbox sees the placeholder in
	FromEnv string   `yaml:"from_env" json:"from_env"` // the host environment variable holding the value
	Hosts   []string `yaml:"hosts" json:"hosts"`       // egress rules of the hosts it may be sent to
	// Where the proxy puts the value, and nowhere else: Header ("" is Authorization), after Scheme ("" is Bearer
	// in Authorization; none, Basic, token, ...), and the Fields opted into by name (header:<Name>, form:<field>,
	// json:<member>). AllowPlaintext lets it go into plain http:// requests too (by default only inspected TLS).
	Header         string   `yaml:"header" json:"header,omitempty"`
	Scheme         string   `yaml:"scheme" json:"scheme,omitempty"`
	Fields         []string `yaml:"fields" json:"fields,omitempty"`
	AllowPlaintext bool     `yaml:"allow_plaintext" json:"allow_plaintext,omitempty"`
}
