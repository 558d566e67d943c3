// Package diag is the typed diagnostic every parser and check of sandkeep reports: a stable code, where (file,
// line, column), a sentence and a fix hint. Every diagnostic code is a constant here, grouped by hundreds:
// SK1xx the spec file, SK2xx devcontainer.json, SK3xx network rules, SK4xx doctor's checks, SK5xx trust tiers.
package diag

import (
	"fmt"
	"strings"
)

// Code is a stable diagnostic code. Never change the meaning of an existing code.
type Code string

// Severity says whether a diagnostic stops the run.
type Severity string

// Severities.
const (
	Error   Severity = "error"
	Warning Severity = "warning"
)

// Diagnostic is one problem found in an input.
type Diagnostic struct {
	Code     Code     `json:"code"`
	Severity Severity `json:"severity"`
	File     string   `json:"file,omitempty"`
	Line     int      `json:"line,omitempty"` // 1-based; 0 when unknown
	Column   int      `json:"column,omitempty"`
	Message  string   `json:"message"`
	Hint     string   `json:"hint,omitempty"`
	// Tier and Field are set by the trust-tier checks (internal/tier): the tier that may not set the field
	// ("repository"), and the field as the spec spells it ("sandbox.mounts[0]").
	Tier  string `json:"tier,omitempty"`
	Field string `json:"field,omitempty"`
}

// String is "file:line:col: SK101 error: message (hint: ...)", with " [tier repository, field sandbox.user]"
// before the hint when Tier or Field is set.
func (d Diagnostic) String() string {
	var b strings.Builder
	if d.File != "" {
		b.WriteString(d.File)
		if d.Line > 0 {
			fmt.Fprintf(&b, ":%d", d.Line)
			if d.Column > 0 {
				fmt.Fprintf(&b, ":%d", d.Column)
			}
		}
		b.WriteString(": ")
	}
	fmt.Fprintf(&b, "%s %s: %s", d.Code, d.Severity, d.Message)
	switch {
	case d.Tier != "" && d.Field != "":
		fmt.Fprintf(&b, " [tier %s, field %s]", d.Tier, d.Field)
	case d.Tier != "":
		fmt.Fprintf(&b, " [tier %s]", d.Tier)
	case d.Field != "":
		fmt.Fprintf(&b, " [field %s]", d.Field)
	}
	if d.Hint != "" {
		fmt.Fprintf(&b, " (hint: %s)", d.Hint)
	}
	return b.String()
}

// List is the diagnostics of one input; it is an error when it holds at least one Error.
type List []Diagnostic

// HasErrors reports whether any diagnostic is an Error.
func (l List) HasErrors() bool {
	for _, d := range l {
		if d.Severity == Error {
			return true
		}
	}
	return false
}

// Err returns l as an error when it has errors, else nil.
func (l List) Err() error {
	if !l.HasErrors() {
		return nil
	}
	return ListError(l)
}

// ListError is a List that failed; its message lists every diagnostic, one per line.
type ListError List

func (e ListError) Error() string {
	lines := make([]string, len(e))
	for i, d := range e {
		lines[i] = d.String()
	}
	return strings.Join(lines, "\n")
}

// Diagnostic codes. One per line, each with what it means; never reuse or renumber one.
//
// SK1xx: the spec file (sandkeep.yaml), reported by internal/spec.
const (
	SpecFile              Code = "SK100" // the file is unreadable, empty, not YAML, not one mapping with a sandbox block, or uses aliases
	SpecMode              Code = "SK101" // sandbox.mode is not "", none, auto or inline
	SpecNetworkModeMisuse Code = "SK102" // a network mode (allowlist, denylist, open) written as sandbox.mode
	SpecImageAndBuild     Code = "SK103" // both image and build are set
	SpecBuildDockerfile   Code = "SK104" // build has no dockerfile
	SpecWorkspaceFolder   Code = "SK105" // workspace_folder is not an absolute, clean path other than /
	SpecControlChar       Code = "SK106" // a string holds control characters, bidirectional overrides or invalid UTF-8
	SpecUnknownField      Code = "SK107" // a key that the block does not have
	SpecWrongType         Code = "SK108" // a value of the wrong YAML type (a list for a map, a number for a string, null)
	SpecDuplicateKey      Code = "SK109" // a key given twice in one mapping
	SpecUser              Code = "SK110" // user is not a name, uid or uid:gid
	SpecEnv               Code = "SK111" // an env (or build arg) name or value refused by the guard
	SpecMount             Code = "SK112" // a mount refused by the guard (a warning when only its source is missing)
	SpecTmpfs             Code = "SK113" // a tmpfs entry with a bad target or option
	SpecResources         Code = "SK114" // cpus, memory or pids out of range or malformed
	SpecHostState         Code = "SK115" // host_state is not auto or none
	SpecSecretFile        Code = "SK116" // a secret_files entry with a bad name, path, source or mode, or a duplicate
	SpecNetwork           Code = "SK117" // a network block with a bad mode, inherit or preset (rules are SK3xx)
	SpecBuildPath         Code = "SK118" // build context or dockerfile escapes the repository root
	SpecPostCreate        Code = "SK119" // post_create holds control characters other than tab and newline
)

// SK3xx: network rules, reported by internal/egress (and by the spec parser and doctor, at the rule's place).
const (
	RuleEmpty      Code = "SK301" // an empty rule, or a lone "!"
	RuleWildcard   Code = "SK302" // a wildcard that is not a whole leading "*." or "**." label, nor "**" alone
	RulePort       Code = "SK303" // a port that is not a decimal 1..65535
	RuleCIDR       Code = "SK304" // a malformed CIDR, or one with bits set past its prefix length
	RuleHost       Code = "SK305" // a host that is not a valid DNS name, IDN or IP literal
	RuleWildcardIP Code = "SK306" // a wildcard on an IP address or CIDR
)

// SK4xx: doctor's checks of the engine a sandbox runs on, reported by internal/doctor (EngineChecks).
const (
	DoctorEngineSeccompOld Code = "SK401" // warning: Docker before 25.0, whose default seccomp profile allows io_uring and ptrace (sandkeep's own profile covers its sandboxes)
	DoctorEngineNoSeccomp  Code = "SK402" // the engine reports no seccomp support: sandkeep's profile cannot be applied
	DoctorEngineVersion    Code = "SK403" // warning: the engine's version is not one doctor can read
	DoctorRuntimeMissing   Code = "SK404" // the sandbox runtime (SANDKEEP_RUNTIME) is not registered with the engine
	DoctorRuntimeGVisor    Code = "SK405" // warning: sandboxes run under gVisor (runsc): no host-socket agent channel (processes and concurrent commands go through the relay), networked commands refused (EGRESS_UNAVAILABLE), exec'd commands are not under the OCI seccomp profile
	DoctorRuntimeDefault   Code = "SK406" // warning: the engine's default runtime is not runc, and sandboxes name none
	DoctorUsernsRemap      Code = "SK407" // warning: the engine remaps user namespaces (userns-remap) or runs rootless: per-key uids must fall inside its mapping
	DoctorSandboxUIDShared Code = "SK408" // warning: per-key host uids are off: every sandbox runs as one host uid
	DoctorBuildPids        Code = "SK409" // warning: a build's RUN steps get no pids limit (no cgroupfs driver, a remote engine, or sandkeep not root)
	DoctorBuildSeccomp     Code = "SK410" // warning: a build's RUN steps run under the engine's default seccomp profile, not sandkeep's
	DoctorKubeSeccomp      Code = "SK411" // warning: kubernetes sandbox pods run under the runtime's default seccomp profile (RuntimeDefault), not sandkeep's (Localhost)
	DoctorKubePids         Code = "SK412" // warning: a kubernetes node has no podPidsLimit (or a large one, or it cannot be read): a sandbox pod's processes are not bounded
)

// SK2xx: devcontainer.json, reported by internal/devcontainer.
const (
	DevcontainerSyntax          Code = "SK200" // not valid JSONC, not one object at the top level, or nested too deep
	DevcontainerImageBuild      Code = "SK201" // image and build both set, neither set, or a build without a dockerfile
	DevcontainerDropped         Code = "SK202" // warning: an option that would weaken the posture (privileged, a capability, a host namespace, a refused bind, initializeCommand...) is dropped
	DevcontainerRunArgsIgnored  Code = "SK203" // warning: runArgs that are not refused are not passed on either
	DevcontainerVariable        Code = "SK204" // warning: an unknown or unterminated ${...}, or ${containerEnv:...} in containerEnv itself
	DevcontainerMountRefused    Code = "SK205" // a mount refused by the guard (or an object mount with a comma in a path)
	DevcontainerCompose         Code = "SK206" // a compose-based devcontainer.json that this sandkeep cannot resolve
	DevcontainerType            Code = "SK207" // a field sandkeep reads has the wrong JSON type
	DevcontainerUnsupported     Code = "SK208" // warning: a field or form sandkeep ignores (an unknown field, build.options outside the safe subset...)
	DevcontainerDuplicate       Code = "SK209" // a field sandkeep reads, or an env/args key, given twice
	DevcontainerBuildPath       Code = "SK210" // build dockerfile or context outside the repository
	DevcontainerWorkspaceFolder Code = "SK211" // workspaceFolder is not an absolute, clean path other than /
	DevcontainerEnv             Code = "SK212" // a containerEnv/remoteEnv name or value refused by the guard
	DevcontainerLocalEnvDenied  Code = "SK213" // warning: ${localEnv:NAME} of a deny-class name is not read from the host
	DevcontainerValue           Code = "SK214" // image or user empty or with spaces or control characters; postCreateCommand with control characters
	DevcontainerUnreadable      Code = "SK215" // the file escapes the repository, is not a regular file, is too large or unreadable
	DevcontainerTooMany         Code = "SK216" // more diagnostics than are shown (an error when one of them was)
	DevcontainerLocalEnvHidden  Code = "SK217" // warning: ${localEnv:NAME} of a name not listed by the operator (local_env) is not read
)

// SK5xx: trust tiers, reported by internal/tier: what a repository's sandkeep.yaml or devcontainer.json set
// that only the operator may. Each carries Tier and Field, and a hint naming the operator setting that
// would allow it.
const (
	TierModeNone          Code = "SK500" // the repository asks for mode: none (no sandbox)
	TierUser              Code = "SK501" // the repository sets the sandbox's user (uid:gid is the operator's)
	TierMountOutside      Code = "SK502" // a repository mount whose source is outside the repository (or a link out of it) and not under an operator host path
	TierMountWritable     Code = "SK503" // warning: a writable repository mount, made read-only (repo_mounts_writable is off)
	TierSecretSource      Code = "SK504" // a repository secret_files entry with from_env or from_file (a source is the operator's)
	TierSecretUnknown     Code = "SK505" // a repository secret_files entry names a secret the operator did not define
	TierCredentialSource  Code = "SK506" // a repository network credential with from_env or hosts (value and hosts are the operator's)
	TierCredentialUnknown Code = "SK507" // a repository network credential names a credential the operator did not define
	TierNetworkOpen       Code = "SK508" // a repository network mode open or denylist, or a "**" rule (repo_network_open is off)
	TierNetworkIPRule     Code = "SK509" // a repository network rule that is an IP address or CIDR (repo_network_ip_rules is off)
	TierHostState         Code = "SK510" // the repository asks for host_state: auto (host state is the operator's to bind)
	TierOperatorInvalid   Code = "SK511" // the operator's own tier settings are malformed (a secret name, a from_file, a host)
	TierBuildRefused      Code = "SK512" // the repository asks for an image build (Dockerfile, feature, companion build) and the operator refuses them (repo_builds: refuse)
	TierHostServices      Code = "SK513" // the repository registers or asks for host services (host_services, services): they are the operator's to offer
	TierImageRefused      Code = "SK514" // the repository names an image (image:, a build's FROM) the engine lacks, from a registry not in image_registries
)
