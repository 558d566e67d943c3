package doctor

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/engine"
)

// Engine is what doctor knows of the container engine (the Docker driver's Engine).
type Engine struct {
	Version         string   // e.g. "20.10.24+dfsg1"
	Runtimes        []string // registered OCI runtimes
	DefaultRuntime  string   // what a container naming none gets
	SecurityOptions []string // seccomp, apparmor, userns, rootless, ...

	// What a build's RUN steps get (the Docker driver's BuildLimits): the pids bound of one build (0: none,
	// BuildPidsOff says why) and the seccomp profile, the daemon's default ("default" is the engine's own).
	BuildPids    int64
	BuildPidsOff string
	BuildSeccomp string
}

// Sandboxes is how sandkeep's configuration asks sandboxes to run on that engine.
type Sandboxes struct {
	Runtime string // the OCI runtime sandboxes name ("" the engine's default)
	// UIDs is the per-key host uid range in force ("" when off); UIDsOff says why it is off when it is.
	UIDs    string
	UIDsOff string
}

// runsc is gVisor's runtime name (the lifecycle's RuntimeGVisor).
const runsc = "runsc"

// seccompFixedIn is the first Docker release whose default seccomp profile refuses io_uring.
const seccompFixedIn = 25

// EngineChecks judge the engine and the sandboxes' runtime and identity, one Result each: "engine seccomp",
// "sandbox runtime", "user namespaces", "sandbox uids", "build limits". A Result that is not a pass carries a
// diag code (SK4xx), written first in its Detail too.
func EngineChecks(e Engine, s Sandboxes) []Result {
	return []Result{engineSeccomp(e), sandboxRuntime(e, s), userNamespaces(e, s), sandboxUIDs(s), buildLimits(e)}
}

// engineNames are EngineChecks' names, in its order.
var engineNames = []string{"engine seccomp", "sandbox runtime", "user namespaces", "sandbox uids", "build limits"}

// buildLimits judges what a repository's build (Dockerfile RUN steps, a feature's install.sh, a companion's
// build) runs under: they run as root with the engine's capabilities, so the pids bound and the seccomp profile
// are what keep a hostile Dockerfile from the host's process table and kernel surface (issue 22, finding 3).
func buildLimits(e Engine) Result {
	var r Result
	const refuse = "or refuse repository builds: repo_builds: refuse in the operator's config (docs/SECURITY.md, \"Builds\")"
	switch {
	case e.BuildPids == 0:
		r = coded(Warn, diag.DoctorBuildPids, "builds' RUN steps have no pids limit: "+e.BuildPidsOff,
			"run sandkeep as root beside an engine with the cgroupfs cgroup driver, "+refuse)
	case e.BuildSeccomp == "default" || e.BuildSeccomp == "builtin" || e.BuildSeccomp == "":
		r = coded(Warn, diag.DoctorBuildSeccomp, fmt.Sprintf("builds' RUN steps run under the engine's default seccomp profile (the engine refuses a seccomp option on a build; Docker %s's default allows io_uring and ptrace before 25.0); pids are bounded at %d per build", e.Version, e.BuildPids),
			"make sandkeep's profile the daemon's default (`sandkeep doctor --seccomp-profile > /etc/docker/sandkeep-seccomp.json`, then \"seccomp-profile\" in /etc/docker/daemon.json), "+refuse)
	default:
		r = Result{Status: Pass, Detail: fmt.Sprintf("RUN steps: pids bounded at %d per build, nofile and core ulimits, the daemon's seccomp profile %s", e.BuildPids, e.BuildSeccomp)}
	}
	r.Name = "build limits"
	return r
}

func coded(status Status, code diag.Code, detail, fix string) Result {
	return Result{Status: status, Code: string(code), Detail: string(code) + ": " + detail, Fix: fix}
}

func engineSeccomp(e Engine) Result {
	r := Result{Name: "engine seccomp"}
	if !slices.Contains(e.SecurityOptions, "seccomp") {
		r2 := coded(Fail, diag.DoctorEngineNoSeccomp, fmt.Sprintf("Docker %s reports no seccomp support (security options: %s), so sandkeep's profile cannot be applied",
			e.Version, strings.Join(e.SecurityOptions, ", ")), "run the engine on a kernel with seccomp (CONFIG_SECCOMP_FILTER) and a dockerd built with it")
		r2.Name = r.Name
		return r2
	}
	major, ok := majorVersion(e.Version)
	switch {
	case !ok:
		r = coded(Warn, diag.DoctorEngineVersion, fmt.Sprintf("engine version %q is not one doctor can read; sandkeep applies its own seccomp profile whatever the engine's default", e.Version),
			"check `docker version`")
	case major < seccompFixedIn:
		r = coded(Warn, diag.DoctorEngineSeccompOld, fmt.Sprintf("Docker %s: its default seccomp profile allows io_uring and ptrace (refused by default from 25.0); sandkeep applies its own profile to every sandbox, but other containers on this engine keep the default", e.Version),
			"nothing to do for sandkeep's sandboxes; upgrade Docker to 25 or later for the engine's other containers")
	default:
		r = Result{Status: Pass, Detail: fmt.Sprintf("Docker %s; sandkeep applies its own profile too", e.Version)}
	}
	r.Name = "engine seccomp"
	return r
}

func sandboxRuntime(e Engine, s Sandboxes) Result {
	var r Result
	switch {
	case s.Runtime != "" && !slices.Contains(e.Runtimes, s.Runtime):
		r = coded(Fail, diag.DoctorRuntimeMissing, fmt.Sprintf("sandboxes ask for runtime %q; the engine has %s", s.Runtime, strings.Join(e.Runtimes, ", ")),
			"register it in /etc/docker/daemon.json (scripts/docker-up.sh with SANDKEEP_RUNSC=1 does it for runsc), or unset SANDKEEP_RUNTIME")
	case s.Runtime == runsc:
		r = coded(Warn, diag.DoctorRuntimeGVisor, "gVisor (runsc): system calls are answered by its Sentry, not the host kernel; there is no host-socket agent channel: a command run one at a time goes through the engine's exec and is not under sandkeep's seccomp profile there, while processes and concurrent commands go through the relay (an engine exec carrying a session of the sandbox's init); a command or process that asks for a network is refused with EGRESS_UNAVAILABLE (docs/SECURITY.md, \"gVisor\")",
			"nothing to do if the sandboxes need no network: this is the operator's choice; unset SANDKEEP_RUNTIME for runc, its host-socket agent channel and egress")
	case s.Runtime == "" && e.DefaultRuntime != "" && e.DefaultRuntime != "runc":
		r = coded(Warn, diag.DoctorRuntimeDefault, fmt.Sprintf("sandboxes name no runtime and the engine's default is %q, which sandkeep's hardening was not checked against", e.DefaultRuntime),
			"set SANDKEEP_RUNTIME=runc (or runsc) to choose one")
	default:
		rt := s.Runtime
		if rt == "" {
			rt = e.DefaultRuntime + " (the engine's default)"
		}
		gv := "runsc is not registered"
		if slices.Contains(e.Runtimes, runsc) {
			gv = "runsc is registered: SANDKEEP_RUNTIME=runsc runs sandboxes under gVisor"
		}
		r = Result{Status: Pass, Detail: fmt.Sprintf("%s: the host kernel answers sandboxes' system calls through sandkeep's seccomp profile; %s", rt, gv)}
	}
	r.Name = "sandbox runtime"
	return r
}

func userNamespaces(e Engine, s Sandboxes) Result {
	var r Result
	var remap []string
	for _, o := range []string{"userns", "rootless"} {
		if slices.Contains(e.SecurityOptions, o) {
			remap = append(remap, o)
		}
	}
	switch {
	case len(remap) > 0 && s.UIDs != "":
		r = coded(Warn, diag.DoctorUsernsRemap, fmt.Sprintf("the engine maps user namespaces (%s): a sandbox uid is shifted into the engine's subordinate range, and a per-key uid of %s past that range's size has no host uid", strings.Join(remap, ", "), s.UIDs),
			"give dockerd a subordinate range that covers the per-key range, set SANDKEEP_SANDBOX_UIDS to a range inside its size, or SANDKEEP_SANDBOX_UIDS=off")
	case len(remap) > 0:
		r = Result{Status: Pass, Detail: fmt.Sprintf("the engine maps user namespaces (%s): a sandbox's uid is a subordinate uid on the host", strings.Join(remap, ", "))}
	default:
		r = Result{Status: Pass, Detail: "the engine maps none (no userns-remap, not rootless): a sandbox's uid inside is its uid on the host"}
		if s.UIDs != "" {
			r.Detail += ", one of its own per key (" + s.UIDs + ")"
		}
	}
	r.Name = "user namespaces"
	return r
}

func sandboxUIDs(s Sandboxes) Result {
	var r Result
	if s.UIDs == "" {
		r = coded(Warn, diag.DoctorSandboxUIDShared, "per-key host uids are off ("+s.UIDsOff+"): every sandbox runs as the same host uid, and a workspace is kept from other keys' sandboxes by its mode alone",
			"run sandkeep as root without SANDKEEP_SANDBOX_USER, or set SANDKEEP_SANDBOX_UIDS=FIRST-LAST (docs/SECURITY.md, \"Identity\")")
	} else {
		r = Result{Status: Pass, Detail: "each key's sandbox runs as a host uid of its own from " + s.UIDs}
	}
	r.Name = "sandbox uids"
	return r
}

// majorVersion reads the major number of an engine version such as "20.10.24+dfsg1" or "27.3.1".
func majorVersion(v string) (int, bool) {
	head, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(head)
	return n, err == nil && n > 0
}

// HardeningChecks are EngineChecks as doctor Checks, each needing needs; facts is asked once, by the first of
// them to run, and its error fails them all.
func HardeningChecks(needs []string, facts func(ctx context.Context) (Engine, Sandboxes, error)) []Check {
	var (
		once    sync.Once
		results []Result
		err     error
	)
	names := engineNames
	checks := make([]Check, len(names))
	for i, name := range names {
		checks[i] = Check{Name: name, Needs: needs, Run: func(ctx context.Context) Result {
			once.Do(func() {
				var e Engine
				var s Sandboxes
				if e, s, err = facts(ctx); err == nil {
					results = EngineChecks(e, s)
				}
			})
			if err != nil {
				return Result{Status: Fail, Detail: "the engine did not say: " + err.Error(), Fix: "check `docker info`"}
			}
			return results[i]
		}}
	}
	return checks
}

// SandboxesOf is how an operator's config (its runtime, SandboxUIDs and User) runs sandboxes on the docker
// driver: the per-key uid range in force, or why it is off. A malformed range is its error.
func SandboxesOf(runtime, uids, user string) (Sandboxes, error) {
	eff, why, err := engine.SandboxUIDs(uids, user)
	if err != nil {
		return Sandboxes{}, err
	}
	return Sandboxes{Runtime: runtime, UIDs: eff, UIDsOff: why}, nil
}

// Kube is what doctor knows of the kubernetes driver's kernel-facing bounds (kube.Driver.Hardening).
type Kube struct {
	Seccomp      string           // the Localhost profile sandbox pods run under; "" for RuntimeDefault
	PodPidsLimit map[string]int64 // each node's kubelet podPidsLimit (-1 or 0: none)
	PidsErr      error            // why the nodes' limits could not be read
}

// podPidsBound is the largest podPidsLimit doctor passes: the docker driver's pids limit is 512; a node's
// limit is per pod, and a sandbox pod is one sandbox.
const podPidsBound = 4096

// KubeChecks judge a kubernetes cluster's sandbox pods: "kube seccomp" (SK411 warn under the runtime's default
// profile) and "kube pids" (SK412 warn when a node has no podPidsLimit, a larger one than podPidsBound, or it
// cannot be read). Issue 22, Low 11.
func KubeChecks(k Kube) []Result {
	sec := Result{Name: "kube seccomp", Status: Pass, Detail: "sandbox pods run under sandkeep's profile (Localhost " + k.Seccomp + ")"}
	if k.Seccomp == "" {
		sec = coded(Warn, diag.DoctorKubeSeccomp, "sandbox pods run under the container runtime's default seccomp profile (RuntimeDefault), not sandkeep's: containerd 1.6's allows io_uring",
			"install the profile on every node (deploy/kubernetes/seccomp-profile.yaml) and set SANDKEEP_KUBE_SECCOMP=localhost")
		sec.Name = "kube seccomp"
	}
	pids := Result{Name: "kube pids"}
	var open []string
	for _, node := range slices.Sorted(maps.Keys(k.PodPidsLimit)) {
		if l := k.PodPidsLimit[node]; l <= 0 || l > podPidsBound {
			open = append(open, fmt.Sprintf("%s (%d)", node, l))
		}
	}
	switch {
	case k.PidsErr != nil:
		pids = coded(Warn, diag.DoctorKubePids, "the nodes' podPidsLimit could not be read: "+k.PidsErr.Error(),
			"run doctor with a kubeconfig that may get nodes/proxy (an administrator's: the server's service account is not granted it, since GET on nodes/proxy reaches the kubelet's whole API), or check each kubelet's podPidsLimit yourself")
	case len(open) > 0:
		pids = coded(Warn, diag.DoctorKubePids, fmt.Sprintf("a sandbox pod's processes are bounded only by the kubelet's podPidsLimit, and these nodes have none or more than %d: %s", podPidsBound, strings.Join(open, ", ")),
			"set podPidsLimit (e.g. 1024) in each node's kubelet configuration")
	default:
		pids = Result{Status: Pass, Detail: fmt.Sprintf("every node bounds a pod's processes (podPidsLimit %v)", k.PodPidsLimit)}
	}
	pids.Name = "kube pids"
	return []Result{sec, pids}
}
