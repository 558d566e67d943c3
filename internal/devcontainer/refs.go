package devcontainer

import (
	"github.com/tailscale/hujson"

	"github.com/sandkeep/sandkeep/internal/diag"
)

// FeatureRequest is one entry of "features", as written: internal/devcontainer/feature resolves and installs it.
type FeatureRequest struct {
	ID      string // the key: "./my-feature", "ghcr.io/devcontainers/features/go:1"
	Options []byte // the value as standard JSON: an object of options, or a version string
}

// Compose is what a compose-based devcontainer.json names: internal/compose reads the files.
type Compose struct {
	Files       []string // dockerComposeFile, relative to the repository root, slash-separated, in order
	Service     string   // the service that becomes the sandbox
	RunServices []string // the companions to start; nil: every service the files define
}

// features records "features" in the file's order; their values are checked where they are resolved.
func (p *parser) features(m member) []FeatureRequest {
	obj := p.object(`"features"`, m.val)
	if obj == nil {
		return nil
	}
	var out []FeatureRequest
	seen := map[string]int{} // id -> index in out
	for i := range obj.Members {
		mm := &obj.Members[i]
		id := mm.Name.Value.(hujson.Literal).String()
		v := mm.Value.Clone()
		v.Standardize()
		v.Minimize()
		if j, dup := seen[id]; dup {
			// As the devcontainers CLI reads it (a JSON object, the last value of a key winning, the key keeping its
			// first place): one install, in the first one's position, with the last one's options.
			p.warn(diag.DevcontainerDuplicate, mm.Name.StartOffset, "keep one of them",
				"feature %q is given more than once; it is installed once, where it is first given, with the options given last", short(id))
			out[j].Options = v.Pack()
			continue
		}
		seen[id] = len(out)
		out = append(out, FeatureRequest{ID: id, Options: v.Pack()})
	}
	return out
}

// compose records dockerComposeFile, service and runServices. The files are read by internal/compose.
func (p *parser) compose(fields map[string]member) *Compose {
	m := fields["dockerComposeFile"]
	c := &Compose{}
	switch m.val.Value.(type) {
	case *hujson.Array:
		list, ok := p.strList(`"dockerComposeFile"`, m.val)
		if !ok {
			return nil
		}
		for _, a := range list {
			if f := p.repoPath("dockerComposeFile", a.s, a.off); f != "" {
				c.Files = append(c.Files, f)
			}
		}
	default:
		s, ok := p.str(`"dockerComposeFile"`, m.val)
		if !ok {
			return nil
		}
		if f := p.repoPath("dockerComposeFile", s, m.val.StartOffset); f != "" {
			c.Files = append(c.Files, f)
		}
	}
	if len(c.Files) == 0 {
		p.errorf(diag.DevcontainerCompose, m.val.StartOffset, "name the compose file: \"dockerComposeFile\": \"compose.yaml\"", "dockerComposeFile names no file")
		return nil
	}
	sm, ok := fields["service"]
	if !ok {
		p.errorf(diag.DevcontainerCompose, m.key.StartOffset, `name the service that is the sandbox: "service": "app"`, "dockerComposeFile needs \"service\"")
		return nil
	}
	if c.Service, ok = p.str(`"service"`, sm.val); !ok || c.Service == "" {
		return nil
	}
	if rm, ok := fields["runServices"]; ok {
		list, _ := p.strList(`"runServices"`, rm.val)
		c.RunServices = []string{}
		for _, a := range list {
			c.RunServices = append(c.RunServices, a.s)
		}
	}
	return c
}
