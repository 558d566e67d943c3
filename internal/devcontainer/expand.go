package devcontainer

import (
	"crypto/sha256"
	"encoding/hex"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sandkeep/sandkeep/internal/diag"
)

// expand substitutes the variables of s (see the package doc) in one pass: what a variable expands to is
// copied, never scanned again, so a host value holding "${...}" stays as it is. at is the byte offset of the
// string in the file, for diagnostics. containerRef reports a ${containerEnv:...}, which only the running
// container could answer.
func (p *parser) expand(at int, s string) (out string, containerRef bool) {
	if !strings.Contains(s, "${") {
		return s, false
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			break
		}
		b.WriteString(s[:i])
		rest := s[i+2:]
		j := strings.IndexByte(rest, '}')
		if j < 0 {
			p.warn(diag.DevcontainerVariable, at, "write variables as ${localEnv:NAME}, ${localWorkspaceFolder} ...",
				"%q has a \"${\" without a closing \"}\"; it is left as written", short(s[i:]))
			b.WriteString(s[i:])
			break
		}
		body := rest[:j]
		v, ok, cref := p.variable(at, body)
		containerRef = containerRef || cref
		if ok {
			b.WriteString(v)
		} else {
			b.WriteString(s[i : i+2+j+1])
		}
		s = rest[j+1:]
	}
	return b.String(), containerRef
}

// variable expands the body of one ${body}. ok is false when it is left as written.
func (p *parser) variable(at int, body string) (value string, ok, containerRef bool) {
	switch body {
	case "localWorkspaceFolder":
		return p.env.WorkspaceFolder, true, false
	case "localWorkspaceFolderBasename":
		if p.env.WorkspaceFolder == "" {
			return "", true, false
		}
		return filepath.Base(p.env.WorkspaceFolder), true, false
	case "containerWorkspaceFolder":
		return p.containerWS, true, false
	case "containerWorkspaceFolderBasename":
		return path.Base(p.containerWS), true, false
	case "devcontainerId":
		return devcontainerID(p.env.WorkspaceFolder), true, false
	}
	kind, rest, _ := strings.Cut(body, ":")
	switch kind {
	case "localEnv", "env":
		name, def, _ := strings.Cut(rest, ":")
		return p.localEnv(at, name, def), true, false
	case "containerEnv":
		return p.containerEnv(at, rest)
	}
	p.warn(diag.DevcontainerVariable, at,
		"sandkeep expands ${localEnv:NAME[:default]}, ${localWorkspaceFolder}, ${localWorkspaceFolderBasename}, ${containerWorkspaceFolder}",
		"variable ${%s} is not known to sandkeep; it is left as written", short(body))
	return "", false, false
}

// containerEnv expands ${containerEnv:NAME[:default]} where the devcontainers CLI does: in remoteEnv and the
// lifecycle commands, which it substitutes from the created container's environment (the image's ENV with
// containerEnv over it). Without Env.Container the reference is left as written and the field is recorded in
// Config.ContainerRefs for a second Parse that has it; elsewhere (containerEnv itself, image, mounts ...) the
// container does not exist yet when the value is used, and containerRef tells the caller.
func (p *parser) containerEnv(at int, rest string) (value string, ok, containerRef bool) {
	if p.where == "" {
		return "", false, true
	}
	name, def, _ := strings.Cut(rest, ":")
	if name == "" {
		p.warn(diag.DevcontainerVariable, at, "name the variable: ${containerEnv:PATH}",
			"${containerEnv} names no variable; it is left as written")
		return "", false, false
	}
	if p.env.Container == nil {
		if !slices.Contains(p.containerRefs, p.where) {
			p.containerRefs = append(p.containerRefs, p.where)
		}
		return "", false, true
	}
	if v, found := p.env.Container(name); found {
		return v, true, false
	}
	return def, true, false
}

// localEnv looks name up on the host, unless it is of the deny class (a repository must not be able to copy
// the operator's credentials into the sandbox under a harmless name) or Env.Listed does not list it.
func (p *parser) localEnv(at int, name, def string) string {
	if name == "" {
		return def
	}
	if class := DenyClass(name); class != "" {
		p.warn(diag.DevcontainerLocalEnvDenied, at,
			"a repository may not read such host variables; set the value in the spec's env, or a credential as a secret file",
			"${localEnv:%s} names a host variable of the %s class; it is not read (the default, or \"\", is used)", short(name), class)
		return def
	}
	if p.env.Listed != nil && !p.env.Listed(name) {
		p.warn(diag.DevcontainerLocalEnvHidden, at,
			"an operator lets a repository read a host variable by listing it in local_env in the operator config; or set the value in the spec's env",
			"${localEnv:%s} is not listed by the operator (local_env); it is not read (the default, or \"\", is used)", short(name))
		return def
	}
	if p.env.Lookup == nil {
		return def
	}
	if v, ok := p.env.Lookup(name); ok {
		return v
	}
	return def
}

// devcontainerID is ${devcontainerId}: stable for one repository on one host, safe in a volume name. The
// devcontainer CLI hashes the container's labels; sandkeep's volumes are per key anyway, so a hash of the
// repository's folder keeps the names the file makes stable and distinct per repository.
func devcontainerID(workspace string) string {
	sum := sha256.Sum256([]byte("sandkeep-devcontainer-id\x00" + workspace))
	return hex.EncodeToString(sum[:])[:26]
}

// short cuts s for a message.
func short(s string) string {
	const max = 64
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}
