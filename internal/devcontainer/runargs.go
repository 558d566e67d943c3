package devcontainer

import (
	"regexp"
	"strings"
)

// runArgs are never passed to the engine: sandkeep builds the container's posture itself. Each one is either
// refused (it asks for power over the host, so the repository expects a sandbox sandkeep will not make) or
// ignored with a warning. Refused:
//
//	--privileged*  --cap-add*  --device*  --gpus  --security-opt*  --volumes-from
//	--pid, --ipc, --uts, --cgroupns, --userns, --network, --net   with the value host or container:<id>
//	-v, --volume   whose source is a host path (not a named volume)
//	--mount        of type bind (or with no type and a path as source)
//
// A flag's value is read from "--flag=value" or from the next element; every element is also checked as a
// flag of its own, so ["--label", "--privileged"] is refused although Docker would read it as a label.

// namespaceFlags share a namespace with the host, or another container, when their value says so.
var namespaceFlags = map[string]bool{
	"--pid": true, "--ipc": true, "--uts": true, "--cgroupns": true, "--userns": true, "--network": true, "--net": true,
}

// refusedPrefixes are refused whatever follows.
var refusedPrefixes = []string{"--privileged", "--cap-add", "--device"}

// refusedFlags are refused whatever their value.
var refusedFlags = map[string]bool{"--gpus": true, "--volumes-from": true}

// namedVolume is Docker's rule for a volume name; anything else before the colon of -v is a host path.
var namedVolume = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// arg is one element of runArgs and where it is in the file.
type arg struct {
	s   string
	off int
}

// refusal is one refused runArg: what to name, where.
type refusal struct {
	text string // the flag, with its value when separate ("--cap-add SYS_PTRACE")
	why  string
	off  int
}

// checkRunArgs sorts runArgs into refused ones and the text of the ignored ones.
func checkRunArgs(args []arg) (refused []refusal, ignored []string) {
	for i := 0; i < len(args); i++ {
		a := args[i].s
		if !strings.HasPrefix(a, "-") {
			ignored = append(ignored, a)
			continue
		}
		name, value, attached := flagParts(a)
		next := ""
		if !attached && i+1 < len(args) && !strings.HasPrefix(args[i+1].s, "-") {
			next = args[i+1].s
			value = next
		}
		text := a
		if next != "" {
			text = a + " " + next
		}
		if why := refuseFlag(name, value); why != "" {
			refused = append(refused, refusal{text: text, why: why, off: args[i].off})
		} else {
			ignored = append(ignored, text)
		}
		if next != "" {
			i++ // the value was consumed; it does not start with '-', so it is no flag to check
		}
	}
	return refused, ignored
}

// flagParts splits "--name=value", "-vvalue", "-v=value" or "--name".
func flagParts(a string) (name, value string, attached bool) {
	if strings.HasPrefix(a, "--") {
		name, value, attached = strings.Cut(a, "=")
		return name, value, attached
	}
	// A short flag: only -v takes a value sandkeep cares about; "-v/src:/dst" and "-v=/src:/dst" attach it.
	if len(a) > 2 {
		return a[:2], strings.TrimPrefix(a[2:], "="), true
	}
	return a, "", false
}

// refuseFlag says why a flag with its value is refused, or "" when it is only ignored.
func refuseFlag(name, value string) string {
	for _, p := range refusedPrefixes {
		if strings.HasPrefix(name, p) {
			return "it gives the container power over the host"
		}
	}
	if strings.HasPrefix(name, "--security-opt") {
		return "it turns off a confinement (seccomp, AppArmor, no-new-privileges) sandkeep keeps on"
	}
	if refusedFlags[name] {
		return "it gives the container the host's devices or another container's volumes"
	}
	if namespaceFlags[name] && (value == "host" || strings.HasPrefix(value, "container:")) {
		return "it shares a namespace with the host or another container"
	}
	switch name {
	case "-v", "--volume":
		if hostVolume(value) {
			return "it binds a host path; use the spec's mounts, which pass sandkeep's mount guard"
		}
	case "--mount":
		if bindMount(value) {
			return "it binds a host path; use devcontainer.json's mounts or the spec's, which pass sandkeep's mount guard"
		}
	}
	return ""
}

// hostVolume reports whether a -v value binds a host path: a source before the first colon that is not a
// volume name. "-v /data" (no colon) is an anonymous volume.
func hostVolume(v string) bool {
	src, _, ok := strings.Cut(v, ":")
	return ok && !namedVolume.MatchString(src)
}

// bindMount reports whether a --mount value is a bind: type=bind, or no type and a source that is a path.
func bindMount(v string) bool {
	typ, src := "", ""
	for _, f := range strings.Split(v, ",") {
		k, val, _ := strings.Cut(f, "=")
		switch strings.ToLower(k) {
		case "type":
			typ = strings.ToLower(val)
		case "source", "src":
			src = val
		}
	}
	return typ == "bind" || (typ == "" && src != "" && !namedVolume.MatchString(src))
}
