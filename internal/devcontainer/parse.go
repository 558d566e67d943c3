package devcontainer

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tailscale/hujson"

	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// Parse reads one devcontainer.json. path names the file in diagnostics and, with env.WorkspaceFolder, says
// where the file lies in the repository (build paths are relative to the file). The result is nil exactly when
// the list has errors; warnings come with a usable Config.
//
// The file is parsed with hujson, standardized (comments and trailing commas become spaces, so offsets keep
// their meaning) and decoded by walking the value tree field by field, which is what gives every diagnostic,
// wrong types included, the line and column of the value at fault.
func Parse(path string, data []byte, env Env) (*Config, diag.List) {
	p := &parser{file: path, src: data, env: env, containerWS: driver.WorkspaceDir, pos: map[string]int{}}
	cfg := p.parse()
	// In the file's order, for a reader going down it; the parse visits fields in a fixed order instead.
	slices.SortStableFunc(p.list, func(a, b diag.Diagnostic) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
	if p.dropped > 0 {
		sev := diag.Warning
		if p.droppedErr {
			sev = diag.Error
		}
		p.list = append(p.list, diag.Diagnostic{Code: diag.DevcontainerTooMany, Severity: sev, File: path,
			Message: fmt.Sprintf("%d more diagnostics are not shown", p.dropped)})
	}
	if p.list.HasErrors() {
		return nil, p.list
	}
	slices.SortStableFunc(cfg.Dropped, func(a, b Drop) int { return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Col, b.Col)) })
	cfg.Path = path
	cfg.ContainerRefs = p.containerRefs
	cfg.pos = make(map[string][2]int, len(p.pos))
	for field, off := range p.pos {
		line, col := lineCol(p.src, off)
		cfg.pos[field] = [2]int{line, col}
	}
	return cfg, p.list
}

// parser holds one Parse.
type parser struct {
	file        string
	src         []byte
	env         Env
	list        diag.List
	dropped     int            // diagnostics past maxDiags, counted only
	droppedErr  bool           // one of them was an error
	containerWS string         // ${containerWorkspaceFolder}: the file's workspaceFolder, else sandkeep's /workspace
	pos         map[string]int // byte offset of the value each field was read from (see Config.pos)

	where         string   // the field being read where ${containerEnv:...} expands ("remoteEnv.PATH", "postStartCommand"), else ""
	containerRefs []string // Config.ContainerRefs
}

// member is one top-level field.
type member struct {
	name string
	key  *hujson.Value // the name, for "this field" diagnostics
	val  *hujson.Value
}

func (p *parser) parse() *Config {
	cfg := &Config{}
	if len(p.src) > MaxSize {
		p.errorf(diag.DevcontainerUnreadable, -1, "keep devcontainer.json under 1 MiB", "devcontainer.json is %d bytes, over the limit of %d", len(p.src), MaxSize)
		return nil
	}
	if off, deep := tooDeep(p.src, MaxDepth); deep {
		p.errorf(diag.DevcontainerSyntax, off, "", "objects and arrays are nested more than %d deep", MaxDepth)
		return nil
	}
	src := p.src
	if len(src) > 0 && src[len(src)-1] != '\n' {
		// hujson wants a newline after a line comment, even the file's last; one more byte moves no offset.
		src = append(slices.Clip(src), '\n')
	}
	root, err := hujson.Parse(src)
	if err != nil {
		if len(src) != len(p.src) {
			if _, err2 := hujson.Parse(p.src); err2 != nil {
				err = err2 // the position in the file as written
			}
		}
		p.syntax(err)
		return nil
	}
	root.Standardize()
	obj, ok := root.Value.(*hujson.Object)
	if !ok {
		p.errorf(diag.DevcontainerSyntax, root.StartOffset, "devcontainer.json is one object: { \"image\": \"...\" }", "the top level is %s, not an object", kindName(root.Value))
		return nil
	}
	fields := p.members(obj)

	// workspaceFolder first: ${containerWorkspaceFolder} in every other field is its value.
	if m, ok := fields["workspaceFolder"]; ok {
		cfg.WorkspaceFolder = p.workspaceFolder(m)
	}
	if m, ok := fields["workspaceMount"]; ok {
		p.workspaceMount(m, cfg)
		if cfg.WorkspaceMount != "" && cfg.WorkspaceFolder == cfg.WorkspaceMount {
			p.containerWS = cfg.WorkspaceFolder
		}
	}
	if m, ok := fields["image"]; ok {
		cfg.Image = p.image(m)
	}
	cfg.Build = p.build(fields, cfg)
	p.imageXorBuild(fields, cfg)

	if m, ok := fields["runArgs"]; ok {
		p.runArgs(m, cfg)
	}
	remote := p.envMap(fields["remoteEnv"])
	container := p.envMap(fields["containerEnv"])
	if len(remote)+len(container) > 0 {
		// The sandbox has one environment for the container and its commands, and the commands are what remoteEnv
		// is for (the tools a user runs): on the same key remoteEnv wins, as the devcontainers CLI gives it to them.
		cfg.Env = map[string]string{}
		maps.Copy(cfg.Env, container)
		maps.Copy(cfg.Env, remote)
	}
	cfg.ContainerEnv, cfg.RemoteEnv = container, remote
	p.users(fields, cfg)
	p.lifecycle(fields, cfg)
	if m, ok := fields["mounts"]; ok {
		cfg.Mounts = p.mounts(m, cfg)
	}
	p.posture(fields, cfg)
	p.schema(fields, cfg)
	return cfg
}

// members indexes the top-level fields. A field given twice is an error when sandkeep reads it (tools
// disagree on which one counts, and a reviewer reading the first would not see the second); a duplicate of a
// field sandkeep ignores (customizations, settings ...) is left alone.
func (p *parser) members(obj *hujson.Object) map[string]member {
	fields := map[string]member{}
	for i := range obj.Members {
		m := &obj.Members[i]
		name := m.Name.Value.(hujson.Literal).String()
		if _, dup := fields[name]; dup {
			if !silentFields[name] {
				p.errorf(diag.DevcontainerDuplicate, m.Name.StartOffset, "keep one of them", "field %q is given more than once", name)
			}
			continue
		}
		fields[name] = member{name: name, key: &m.Name, val: &m.Value}
	}
	return fields
}

// str returns a string field expanded, or ok false (with an error) when it is not a string.
func (p *parser) str(what string, v *hujson.Value) (s string, ok bool) {
	lit, isLit := v.Value.(hujson.Literal)
	if !isLit || lit.Kind() != '"' {
		p.errorf(diag.DevcontainerType, v.StartOffset, "", "%s must be a string, not %s", what, kindName(v.Value))
		return "", false
	}
	s, _ = p.expand(v.StartOffset, lit.String())
	return s, true
}

// strList returns an array of strings expanded, with their offsets.
func (p *parser) strList(what string, v *hujson.Value) ([]arg, bool) {
	arr, ok := v.Value.(*hujson.Array)
	if !ok {
		p.errorf(diag.DevcontainerType, v.StartOffset, "", "%s must be an array of strings, not %s", what, kindName(v.Value))
		return nil, false
	}
	out := make([]arg, 0, len(arr.Elements))
	good := true
	for i := range arr.Elements {
		e := &arr.Elements[i]
		s, ok := p.str(fmt.Sprintf("%s[%d]", what, i), e)
		good = good && ok
		out = append(out, arg{s: s, off: e.StartOffset})
	}
	return out, good
}

// object returns v as an object, or nil with an error.
func (p *parser) object(what string, v *hujson.Value) *hujson.Object {
	obj, ok := v.Value.(*hujson.Object)
	if !ok {
		p.errorf(diag.DevcontainerType, v.StartOffset, "", "%s must be an object, not %s", what, kindName(v.Value))
		return nil
	}
	return obj
}

// workspaceFolder reads the folder commands start in; ${containerWorkspaceFolder} is it from here on.
func (p *parser) workspaceFolder(m member) string {
	s, ok := p.str(`"workspaceFolder"`, m.val)
	if !ok {
		return ""
	}
	if s == "" || s == "/" || !path.IsAbs(s) || path.Clean(s) != s || hasControl(s) {
		p.errorf(diag.DevcontainerWorkspaceFolder, m.val.StartOffset, "give an absolute, clean path such as /workspace",
			"workspaceFolder %q is not an absolute, clean path other than /", short(s))
		return ""
	}
	p.containerWS = s
	return s
}

// image reads the image name.
func (p *parser) image(m member) string {
	s, ok := p.str(`"image"`, m.val)
	if !ok {
		return ""
	}
	if strings.TrimSpace(s) == "" || hasControl(s) || strings.ContainsAny(s, " \t") {
		p.errorf(diag.DevcontainerValue, m.val.StartOffset, `name an image such as "mcr.microsoft.com/devcontainers/base:bookworm"`,
			"image %q is not an image reference", short(s))
		return ""
	}
	return s
}

// build reads build{dockerfile, context, args} and the legacy top-level dockerFile and context. Paths are
// turned relative to the repository root.
func (p *parser) build(fields map[string]member, cfg *Config) *spec.Build {
	var dockerfile, context, target string
	var dfOff, ctxOff, buildOff int
	var args map[string]string
	bm, hasBuild := fields["build"]
	if hasBuild {
		buildOff = bm.key.StartOffset
		p.pos["build"] = buildOff
		obj := p.object(`"build"`, bm.val)
		if obj == nil {
			return nil
		}
		seen := map[string]bool{}
		for i := range obj.Members {
			mm := &obj.Members[i]
			name := mm.Name.Value.(hujson.Literal).String()
			switch name {
			case "dockerfile", "context", "args", "target", "options":
			default:
				continue // cacheFrom, options ...: build tuning sandkeep does not take
			}
			if seen[name] {
				p.errorf(diag.DevcontainerDuplicate, mm.Name.StartOffset, "keep one of them", "field \"build.%s\" is given more than once", name)
				continue
			}
			seen[name] = true
			switch name {
			case "dockerfile":
				dockerfile, _ = p.str(`"build.dockerfile"`, &mm.Value)
				dfOff = mm.Value.StartOffset
			case "context":
				context, _ = p.str(`"build.context"`, &mm.Value)
				ctxOff = mm.Value.StartOffset
			case "args":
				args = p.stringMap(`"build.args"`, &mm.Value)
			case "target":
				if target, _ = p.str(`"build.target"`, &mm.Value); hasControl(target) || strings.ContainsAny(target, " \t") {
					p.errorf(diag.DevcontainerValue, mm.Value.StartOffset, "name a stage of the Dockerfile (FROM ... AS name)", "build.target %q is not a stage name", short(target))
					target = ""
				}
			case "options":
				opts, _ := p.strList(`"build.options"`, &mm.Value)
				var extra map[string]string
				extra, target = p.buildOptions(cfg, opts, target)
				if len(extra) > 0 && args == nil {
					args = map[string]string{}
				}
				for k, v := range extra {
					if _, set := args[k]; !set {
						args[k] = v
					}
				}
			}
		}
	}
	if lm, ok := fields["dockerFile"]; ok {
		if s, ok := p.str(`"dockerFile"`, lm.val); ok && dockerfile == "" {
			dockerfile, dfOff = s, lm.val.StartOffset
			if !hasBuild {
				buildOff = lm.key.StartOffset
			}
		} else if ok {
			p.warn(diag.DevcontainerUnsupported, lm.key.StartOffset, "remove the legacy dockerFile field",
				"dockerFile is ignored: build.dockerfile is set")
		}
	}
	if lm, ok := fields["context"]; ok {
		if s, ok := p.str(`"context"`, lm.val); ok && context == "" {
			context, ctxOff = s, lm.val.StartOffset
		}
	}
	if !hasBuild && dockerfile == "" {
		return nil // a legacy context alone builds nothing
	}
	if dockerfile == "" {
		p.errorf(diag.DevcontainerImageBuild, buildOff, `name the Dockerfile: "build": {"dockerfile": "Dockerfile"}`,
			"build has no dockerfile")
		return nil
	}
	if context == "" {
		context, ctxOff = ".", buildOff
	}
	b := &spec.Build{Args: args, Target: target}
	b.Dockerfile = p.repoPath("build.dockerfile", dockerfile, dfOff)
	b.Context = p.repoPath("build.context", context, ctxOff)
	if b.Dockerfile == "" || b.Context == "" {
		return nil
	}
	return b
}

// repoPath turns a path relative to devcontainer.json (or an absolute one under the workspace folder) into a
// clean path relative to the repository root, or "" with an error when it leaves the repository.
func (p *parser) repoPath(what, s string, off int) string {
	const hint = "keep the Dockerfile and the build context inside the repository"
	if hasControl(s) {
		p.errorf(diag.DevcontainerBuildPath, off, hint, "%s %q has a control character", what, short(s))
		return ""
	}
	var rel string
	if path.IsAbs(s) || filepath.IsAbs(s) {
		ws := p.env.WorkspaceFolder
		if ws == "" {
			p.errorf(diag.DevcontainerBuildPath, off, hint, "%s %q is absolute and no workspace folder is known", what, short(s))
			return ""
		}
		r, err := filepath.Rel(ws, filepath.FromSlash(s))
		if err != nil {
			p.errorf(diag.DevcontainerBuildPath, off, hint, "%s %q is outside the repository", what, short(s))
			return ""
		}
		rel = filepath.ToSlash(r)
	} else {
		dir, err := p.fileDir()
		if err != nil {
			p.errorf(diag.DevcontainerBuildPath, off, hint, "%s %q: %v", what, short(s), err)
			return ""
		}
		rel = path.Join(dir, s)
	}
	rel = path.Clean(rel)
	if rel != "." && !filepath.IsLocal(filepath.FromSlash(rel)) {
		p.errorf(diag.DevcontainerBuildPath, off, hint, "%s %q is outside the repository", what, short(s))
		return ""
	}
	return rel
}

// fileDir is the directory of the file relative to the repository root, slash-separated.
func (p *parser) fileDir() (string, error) {
	dir := filepath.Dir(p.file)
	ws := p.env.WorkspaceFolder
	if ws == "" {
		ws = "."
	}
	rel, err := filepath.Rel(ws, dir)
	if err != nil || !(rel == "." || filepath.IsLocal(rel)) {
		return "", errors.New("the file is not inside the workspace folder, so relative paths cannot be placed")
	}
	return filepath.ToSlash(rel), nil
}

// imageXorBuild applies SK201 and SK206.
func (p *parser) imageXorBuild(fields map[string]member, cfg *Config) {
	if _, ok := fields["dockerComposeFile"]; ok {
		cfg.Compose = p.compose(fields) // the image or build is the service's (internal/compose)
		return
	}
	_, hasImage := fields["image"]
	_, hasBuild := fields["build"]
	_, hasLegacy := fields["dockerFile"]
	hasBuild = hasBuild || hasLegacy
	switch {
	case hasImage && hasBuild:
		off := fields["image"].key.StartOffset
		p.errorf(diag.DevcontainerImageBuild, off, "keep either image or build", "image and build are both set")
		cfg.Image, cfg.Build = "", nil
	case !hasImage && !hasBuild:
		// Codespaces runs such a file in its default image; sandkeep runs it in the operator's.
		p.warn(diag.DevcontainerImageBuild, 0, `name an image ("image": "mcr.microsoft.com/devcontainers/base:bookworm") or a build`,
			"devcontainer.json names neither an image nor a build; the sandbox runs the operator's image")
	}
}

// runArgs drops the runArgs that would weaken the posture (each reported, see Config.Dropped) and warns once
// about the others, which are not passed on either.
func (p *parser) runArgs(m member, cfg *Config) {
	args, _ := p.strList(`"runArgs"`, m.val)
	refused, ignored := checkRunArgs(args)
	for _, r := range refused {
		p.drop(cfg, r.off, "runArgs", r.text, r.why)
	}
	if len(ignored) > 0 {
		q := make([]string, 0, len(ignored))
		for _, s := range ignored {
			if len(q) == 8 {
				q = append(q, fmt.Sprintf("and %d more", len(ignored)-8))
				break
			}
			q = append(q, fmt.Sprintf("%q", short(s)))
		}
		p.warn(diag.DevcontainerRunArgsIgnored, m.key.StartOffset, "set limits and network policy in the spec (sandkeep.yaml)",
			"runArgs are not passed to the engine; ignored: %s", strings.Join(q, ", "))
	}
}

// envMap reads containerEnv or remoteEnv. null unsets (the key is left out); a value that needs the running
// container (${containerEnv:X}) is left out with a warning.
func (p *parser) envMap(m member) map[string]string {
	if m.val == nil {
		return nil
	}
	what := fmt.Sprintf("%q", m.name)
	obj := p.object(what, m.val)
	if obj == nil {
		return nil
	}
	out := map[string]string{}
	for i := range obj.Members {
		mm := &obj.Members[i]
		name := mm.Name.Value.(hujson.Literal).String()
		if _, dup := out[name]; dup {
			p.errorf(diag.DevcontainerDuplicate, mm.Name.StartOffset, "keep one of them", "%s key %q is given more than once", m.name, short(name))
			continue
		}
		if lit, ok := mm.Value.Value.(hujson.Literal); ok && lit.Kind() == 'n' {
			continue
		}
		lit, ok := mm.Value.Value.(hujson.Literal)
		if !ok || lit.Kind() != '"' {
			p.errorf(diag.DevcontainerType, mm.Value.StartOffset, "", "%s value of %q must be a string or null, not %s", m.name, short(name), kindName(mm.Value.Value))
			continue
		}
		if m.name == "remoteEnv" {
			p.where = m.name + "." + name
		}
		v, cref := p.expand(mm.Value.StartOffset, lit.String())
		p.where = ""
		if cref && m.name == "remoteEnv" {
			continue // Env.Container is not set: left out here, expanded by a Parse that has it (Config.ContainerRefs)
		}
		if cref {
			p.warn(diag.DevcontainerVariable, mm.Value.StartOffset, "refer to the container's variables in remoteEnv: \"PATH\": \"${containerEnv:PATH}:/more\"",
				"%s %q refers to ${containerEnv:...}, which the container's own environment cannot refer to (it does not exist yet); %s is left unset", m.name, short(name), short(name))
			continue
		}
		if err := guard.EnvVar(name, v); err != nil {
			p.fault(diag.DevcontainerEnv, mm.Name.StartOffset, err)
			continue
		}
		out[name] = v
	}
	return out
}

// stringMap reads an object of strings (build.args).
func (p *parser) stringMap(what string, v *hujson.Value) map[string]string {
	obj := p.object(what, v)
	if obj == nil {
		return nil
	}
	out := map[string]string{}
	for i := range obj.Members {
		mm := &obj.Members[i]
		name := mm.Name.Value.(hujson.Literal).String()
		if _, dup := out[name]; dup {
			p.errorf(diag.DevcontainerDuplicate, mm.Name.StartOffset, "keep one of them", "%s key %q is given more than once", what, short(name))
			continue
		}
		s, ok := p.str(fmt.Sprintf("%s value of %q", what, short(name)), &mm.Value)
		if !ok {
			continue
		}
		out[name] = s
	}
	return out
}

// user reads containerUser or remoteUser.
func (p *parser) user(m member) string {
	if m.val == nil {
		return ""
	}
	s, ok := p.str(fmt.Sprintf("%q", m.name), m.val)
	if !ok {
		return ""
	}
	if hasControl(s) || strings.ContainsAny(s, " \t") {
		p.errorf(diag.DevcontainerValue, m.val.StartOffset, `name a user such as "vscode" or "1000:1000"`, "%s %q is not a user name", m.name, short(s))
		return ""
	}
	return s
}

// mounts reads mounts: --mount strings or {source, target, type} objects.
func (p *parser) mounts(m member, cfg *Config) []string {
	arr, ok := m.val.Value.(*hujson.Array)
	if !ok {
		p.errorf(diag.DevcontainerType, m.val.StartOffset, "", `"mounts" must be an array, not %s`, kindName(m.val.Value))
		return nil
	}
	var out []string
	for i := range arr.Elements {
		e := &arr.Elements[i]
		what := fmt.Sprintf(`"mounts"[%d]`, i)
		var s string
		switch e.Value.(type) {
		case *hujson.Object:
			var ok bool
			if s, ok = p.mountObject(what, e); !ok {
				continue
			}
		default:
			var ok bool
			if s, ok = p.str(what, e); !ok {
				continue
			}
		}
		if c, ok := p.mount(cfg, e.StartOffset, s); ok {
			p.pos[fmt.Sprintf("mounts[%d]", len(out))] = e.StartOffset
			out = append(out, c)
		}
	}
	return out
}

// mountObject turns {source, target, type} into --mount syntax. A comma would smuggle in another key, so it
// is refused here rather than split later.
func (p *parser) mountObject(what string, e *hujson.Value) (string, bool) {
	obj := e.Value.(*hujson.Object)
	var parts []string
	good := true
	for _, key := range []string{"type", "source", "target"} {
		for i := range obj.Members {
			mm := &obj.Members[i]
			if mm.Name.Value.(hujson.Literal).String() != key {
				continue
			}
			s, ok := p.str(fmt.Sprintf("%s.%s", what, key), &mm.Value)
			if !ok {
				good = false
				continue
			}
			if strings.Contains(s, ",") {
				p.errorf(diag.DevcontainerMountRefused, mm.Value.StartOffset, "rename the path so it has no comma",
					"mount %s %q contains a comma", key, short(s))
				good = false
				continue
			}
			parts = append(parts, key+"="+s)
		}
	}
	return strings.Join(parts, ","), good
}

// mount checks one mount string. Docker's consistency= key (a no-op outside macOS) is dropped. A volume mount
// becomes one of Config.Volumes and a tmpfs mount one of Config.Tmpfs (see schema.go); a bind passes the
// guard, and one the guard refuses (a runtime socket, a sensitive host path) is dropped and reported: the
// file asked for host power, and the sandbox runs without it. A malformed mount is an error (SK205).
func (p *parser) mount(cfg *Config, off int, s string) (string, bool) {
	var keep []string
	typ := ""
	for _, f := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(f, "=")
		switch strings.ToLower(k) {
		case "consistency":
			continue
		case "type":
			typ = strings.ToLower(v)
		}
		keep = append(keep, f)
	}
	if typ == "" && !mountHasPathSource(keep) {
		typ = "volume" // Docker's default type: "source=name,target=/x" is a named volume
	}
	switch typ {
	case "volume":
		p.volume(cfg, off, keep)
		return "", false
	case "tmpfs":
		p.tmpfsMount(cfg, off, keep)
		return "", false
	}
	m, err := guard.SplitMount(strings.Join(keep, ","))
	if err != nil {
		p.fault(diag.DevcontainerMountRefused, off, err)
		return "", false
	}
	if err := guard.CheckMount(m); err != nil {
		why := err.Error()
		var fe *fault.Error
		if errors.As(err, &fe) {
			why = fe.Message
		}
		p.drop(cfg, off, "mounts", s, "the mount guard refuses it: "+why)
		return "", false
	}
	c := "type=bind,source=" + m.Source + ",target=" + m.Target
	if m.ReadOnly {
		c += ",readonly"
	}
	return c, true
}

// joinArgv joins the argv form of postCreateCommand into a command line that sh -c splits back into the same
// argv: a word of only safe characters is kept, any other is single-quoted (an embedded ' becomes '\”).
func joinArgv(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, r := range s {
		if !(r < utf8.RuneSelf && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("@%+=:,./_-", r))) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// hasControl reports a control character or invalid UTF-8 in s.
func hasControl(s string) bool {
	if !utf8.ValidString(s) {
		return true
	}
	return strings.ContainsFunc(s, unicode.IsControl)
}

// badCommand reports a control character other than tab and newline, or invalid UTF-8, in a command line.
func badCommand(s string) bool {
	if !utf8.ValidString(s) {
		return true
	}
	return strings.ContainsFunc(s, func(r rune) bool { return r != '\t' && r != '\n' && unicode.IsControl(r) })
}

// kindName names a JSON value's kind for a message.
func kindName(v hujson.ValueTrimmed) string {
	switch v.Kind() {
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case '"':
		return "a string"
	case '0':
		return "a number"
	case '{':
		return "an object"
	case '[':
		return "an array"
	}
	return "an unknown value"
}

// syntax reports a hujson parse error. hujson's error carries the position only in its text
// ("hujson: line L, column C: ..."); it is read back for Line and Column and the sentence is kept whole.
func (p *parser) syntax(err error) {
	d := diag.Diagnostic{Code: diag.DevcontainerSyntax, Severity: diag.Error, File: p.file,
		Message: "devcontainer.json is not valid JSONC: " + err.Error(),
		Hint:    "check the brackets, commas and quotes around that position"}
	var line, col int
	if n, _ := fmt.Sscanf(err.Error(), "hujson: line %d, column %d:", &line, &col); n == 2 {
		d.Line, d.Column = line, col
	}
	p.list = append(p.list, d)
}

// errorf adds an error at a byte offset (-1: no position).
func (p *parser) errorf(code diag.Code, off int, hint, format string, args ...any) {
	p.add(diag.Error, code, off, hint, fmt.Sprintf(format, args...))
}

// warn adds a warning.
func (p *parser) warn(code diag.Code, off int, hint, format string, args ...any) {
	p.add(diag.Warning, code, off, hint, fmt.Sprintf(format, args...))
}

// fault adds the guard's refusal as an error, keeping its sentence and hint.
func (p *parser) fault(code diag.Code, off int, err error) {
	msg, hint := err.Error(), ""
	var fe *fault.Error
	if errors.As(err, &fe) {
		msg, hint = fe.Message, fe.Hint
	}
	p.add(diag.Error, code, off, hint, msg)
}

// add appends one diagnostic, up to maxDiags; past it only the count (and whether an error was among them)
// is kept, so a hostile file costs bounded work and HasErrors still tells the truth.
func (p *parser) add(sev diag.Severity, code diag.Code, off int, hint, msg string) {
	if len(p.list) >= maxDiags {
		p.dropped++
		p.droppedErr = p.droppedErr || sev == diag.Error
		return
	}
	d := diag.Diagnostic{Code: code, Severity: sev, File: p.file, Message: msg, Hint: hint}
	if off >= 0 {
		d.Line, d.Column = lineCol(p.src, off)
	}
	p.list = append(p.list, d)
}

// lineCol turns a byte offset into a 1-based line and a 1-based column counted in characters.
func lineCol(b []byte, off int) (line, col int) {
	off = min(max(off, 0), len(b))
	line, start := 1, 0
	for i := 0; i < off; i++ {
		if b[i] == '\n' {
			line++
			start = i + 1
		}
	}
	return line, utf8.RuneCount(b[start:off]) + 1
}

// tooDeep reports the offset where objects and arrays nest deeper than max. It skips strings and comments
// the way hujson reads them; hujson stops at the first syntax error, so no bracket it would reach is missed.
func tooDeep(b []byte, max int) (int, bool) {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		case '/':
			switch {
			case i+1 < len(b) && b[i+1] == '/':
				for i < len(b) && b[i] != '\n' {
					i++
				}
			case i+1 < len(b) && b[i+1] == '*':
				end := bytes.Index(b[i+2:], []byte("*/"))
				if end < 0 {
					return 0, false
				}
				i += 2 + end + 1
			}
		case '{', '[':
			depth++
			if depth > max {
				return i, true
			}
		case '}', ']':
			depth--
		}
	}
	return 0, false
}
