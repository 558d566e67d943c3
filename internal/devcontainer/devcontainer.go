// Package devcontainer reads a repository's devcontainer.json and fuses it with the sandkeep spec and the
// operator's overlay into the one spec.Sandbox a sandbox is made from.
//
// devcontainer.json is JSONC (comments, trailing commas), read with github.com/tailscale/hujson. A repository
// may be a stranger's pull request, so the file is untrusted input: it is found and read through an os.Root
// (a symlink out of the repository is refused), every problem is a diag.Diagnostic with a SK2xx code and a
// line and column, runArgs that ask for host power are refused, its mounts pass internal/guard, its
// environment loses the deny class (DenyClass) in Fuse, and ${localEnv:...} never reads a deny-class variable
// of the host, nor one the operator did not list (Env.Listed, SK217).
//
// Fields read (everything else is ignored without a diagnostic, except the few listed under "warned"):
//
//	image                          the image; image xor build (SK201)
//	build.dockerfile, build.context, build.args   the build; relative to the file, turned relative to the
//	                               repository root (SK210 when outside it)
//	dockerFile, context            the legacy spelling of build.dockerfile and build.context
//	runArgs                        never passed on: refused (SK202) or ignored (SK203); the list is in runargs.go
//	containerEnv, remoteEnv        merged into Config.Env; remoteEnv wins on the same key; null is unset
//	containerUser, remoteUser      Config.User; remoteUser wins
//	postCreateCommand              a string, or an argv joined into one: each word single-quoted unless it is
//	                               only [A-Za-z0-9@%+=:,./_-], so sh -c splits it back into the same argv;
//	                               the object form (parallel commands) is not supported (SK208 warning)
//	mounts                         strings in --mount syntax or {source, target, type} objects; binds pass
//	                               guard.ParseMount (SK205); volume and tmpfs mounts are ignored (SK208)
//	workspaceFolder                Config.WorkspaceFolder; absolute and clean (SK211)
//	features                       Config.Features, as written (internal/devcontainer/feature installs them)
//	dockerComposeFile, service, runServices   Config.Compose (internal/compose reads the files); the image or
//	                               build is then the service's
//	warned (SK208, ignored): build.target, initializeCommand, onCreateCommand,
//	                               updateContentCommand, postStartCommand, postAttachCommand
//
// Variables, expanded once (a value substituted is not expanded again) in every string value read (not in
// object keys): ${localEnv:VAR} and ${localEnv:VAR:default} (also the older ${env:...}), ${localWorkspaceFolder},
// ${localWorkspaceFolderBasename}, ${containerWorkspaceFolder}, ${containerWorkspaceFolderBasename}. A missing
// variable without a default is the empty string, as in the devcontainer CLI. ${containerEnv:VAR[:default]}
// expands in remoteEnv and the lifecycle commands from Env.Container (the image's ENV with containerEnv over it,
// as the devcontainers CLI substitutes them once the container exists); without Env.Container those fields are
// listed in Config.ContainerRefs. In containerEnv itself it cannot be known (the container's environment is
// being defined), so that key is left unset (SK204) rather than set to a literal "${containerEnv:PATH}". Any
// other ${...} is left as written with a SK204 warning.
package devcontainer

import (
	"github.com/sandkeep/sandkeep/internal/spec"
)

// Limits on the input. A devcontainer.json is a few kilobytes; these only bound what a hostile one can cost.
const (
	MaxSize  = 1 << 20 // bytes; a larger file is refused (SK215)
	MaxDepth = 64      // nesting of objects and arrays; deeper is refused (SK200) before hujson recurses
)

// maxDiags bounds the diagnostics of one file; past it they are counted in one last diagnostic (SK216).
const maxDiags = 100

// Env is what variable expansion may see of the host. Lookup is the host environment (nil: every variable is
// missing); callers should hand it an allowlist rather than os.LookupEnv, since the file is the repository's
// and every value it expands lands in the sandbox. Deny-class names (DenyClass) are never looked up whatever
// Lookup is. WorkspaceFolder is the repository root on the host (${localWorkspaceFolder}); build paths are
// made relative to it.
//
// Listed, when set, says which names the operator lets a repository read (tier.Operator's local_env): a
// ${localEnv:NAME} of a name it does not list is not looked up, expands to its default (or ""), and is a
// SK217 warning. nil lists every name (Lookup alone decides).
type Env struct {
	Lookup          func(string) (string, bool)
	WorkspaceFolder string
	Listed          func(name string) bool

	// Container is the created container's environment for ${containerEnv:NAME[:default]} in remoteEnv and the
	// lifecycle commands (the devcontainers CLI substitutes those from the container's Config.Env: the image's
	// ENV with containerEnv over it). nil leaves those references as written, leaves such a remoteEnv key out,
	// and lists the fields in Config.ContainerRefs: admission parses once more with it once the image is known.
	Container func(name string) (string, bool)
}

// Config is what sandkeep takes from one devcontainer.json, expanded and checked. Zero fields are unset.
type Config struct {
	Path            string            // the file, as given to Parse
	Image           string            // xor Build
	Build           *spec.Build       // paths relative to the repository root
	Env             map[string]string // containerEnv over remoteEnv; names passed guard.EnvVar; deny class NOT yet stripped (Fuse does)
	User            string            // remoteUser, else containerUser
	PostCreate      string            // a shell command line
	Mounts          []string          // canonical "type=bind,source=...,target=...[,readonly]"; each passed guard.ParseMount at Parse
	WorkspaceFolder string            // absolute, clean
	WorkspaceMount  string            // workspaceMount's target (absolute, clean); its source is the repository

	ContainerEnv, RemoteEnv   map[string]string // the two as written (Env is their merge)
	RemoteUser, ContainerUser string            // user names mapped onto the sandbox's uid (numeric ones are in User)
	UpdateRemoteUserUID       *bool             // recorded: the sandbox's uid is the operator's either way

	OnCreate, UpdateContent string // lifecycle commands, each a shell command line (object forms run in parallel)
	PostStart, PostAttach   string

	Volumes          []Volume          // type=volume mounts: named volumes the sandbox owns
	Tmpfs            []string          // type=tmpfs mounts, "target[:size=N]"
	Init             *bool             // recorded; sandkeep's agent is the container's init either way
	OverrideCommand  *bool             // recorded; sandkeep's agent is the container's command either way
	ShutdownAction   string            // recorded: none, stopContainer or stopCompose; the sweeper stops idle sandboxes
	HostRequirements *HostRequirements // cpus and memory become limits within the operator's caps (Fuse)
	ForwardPorts     []string          // recorded for port forwarding; nothing is published on the host
	Dropped          []Drop            // what would weaken the posture, dropped and reported, in the file's order

	// ContainerRefs lists the fields ("remoteEnv.PATH", "postCreateCommand") that refer to ${containerEnv:...}
	// and were left unexpanded because Env.Container was nil.
	ContainerRefs []string

	Features []FeatureRequest // "features", in the file's order; installed by internal/devcontainer/feature
	Compose  *Compose         // dockerComposeFile, service, runServices; read by internal/compose

	pos map[string][2]int // line and column of the value each field was read from: "user" (and "remoteUser" or "containerUser", whichever gave it), "mounts[i]" (i indexes Mounts)
}

// Pos returns the 1-based line and column in the file of the value a field was read from: "user" (remoteUser,
// else containerUser; "remoteUser" or "containerUser" answers only for the one that gave User) or "mounts[i]"
// (the i-th of Mounts). 0, 0 when unknown (a Config made by hand).
func (c *Config) Pos(field string) (line, col int) {
	if c == nil {
		return 0, 0
	}
	p := c.pos[field]
	return p[0], p[1]
}

// Event is something Fuse did that an operator must be able to read afterwards. It never carries a value.
type Event struct {
	Kind   string // EventEnvDenied
	Key    string // the environment variable's name
	Class  string // the deny class: ClassProxy, ClassLoader, ClassCredential or ClassStartup
	Source string // SourceDevcontainer: where the key came from
	File   string // the devcontainer.json it came from (Config.Path)
}

// EventEnvDenied is the kind of an Event for an environment variable stripped from the repository's env.
// TODO(events): move to internal/events when that package lands; the spelling is the issue's.
const EventEnvDenied = "sandbox_env_denied"

// SourceDevcontainer labels what came from the repository's devcontainer.json.
const SourceDevcontainer = "devcontainer"
