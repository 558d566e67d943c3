package devcontainer

import (
	"strings"

	"github.com/sandkeep/sandkeep/internal/diag"
)

// Mounted is what one mount of a feature's metadata becomes after the screening devcontainer.json's own mounts
// get: a per-key named volume, a tmpfs ("target[:size=N]", Config.Tmpfs's form), or nothing, with why.
type Mounted struct {
	Volume *Volume
	Tmpfs  string
	Why    string // set when the mount, or a part of it (a volume's driver), is not made: dropped and reported
}

// FeatureMount screens one mount a feature's devcontainer-feature.json asks for (in --mount syntax, its
// variables not yet expanded) as devcontainer.json's own mounts are screened: ${devcontainerId} and the other
// variables expand as in the file (env as Parse's), type=volume becomes a per-key named volume, type=tmpfs a
// tmpfs, and a bind is dropped whatever its path: a feature comes from a registry or a folder no operator
// reviewed for host access, and sandkeep binds only what devcontainer.json itself names and the guard allows.
// workspace is the container's workspace folder (a volume or tmpfs may not take its place).
func FeatureMount(s, workspace string, env Env) Mounted {
	p := &parser{env: env, containerWS: workspace, pos: map[string]int{}}
	s, _ = p.expand(-1, s)
	if hasControl(s) {
		return Mounted{Why: "the mount has a control character"}
	}
	cfg := &Config{}
	if _, bind := p.mount(cfg, -1, s); bind {
		return Mounted{Why: "a feature may not bind a host path"}
	}
	for _, d := range p.list {
		if d.Severity == diag.Error {
			return Mounted{Why: d.Message}
		}
	}
	var out Mounted
	if len(cfg.Dropped) > 0 {
		out.Why = cfg.Dropped[0].Why
	}
	switch {
	case len(cfg.Volumes) == 1:
		out.Volume = &cfg.Volumes[0]
	case len(cfg.Tmpfs) == 1:
		out.Tmpfs = cfg.Tmpfs[0]
	case out.Why == "":
		out.Why = "a " + mountType(s) + " mount is not made"
	}
	return out
}

// mountType is the type= of a --mount string, "bind" when absent.
func mountType(s string) string {
	for _, f := range strings.Split(s, ",") {
		if k, v, _ := strings.Cut(f, "="); strings.EqualFold(k, "type") {
			return strings.ToLower(v)
		}
	}
	return "bind"
}
