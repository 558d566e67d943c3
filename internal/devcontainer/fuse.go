package devcontainer

import (
	"maps"
	"slices"
	"strings"

	"github.com/sandkeep/sandkeep/internal/spec"
)

// Fuse makes the one spec.Sandbox a sandbox is made from, from the repository's devcontainer.json (dc), the
// project's spec (sp) and the operator's overlay. Any of the three may be nil. The inputs are not modified.
//
// Rules, in order:
//
//   - Start from the spec.
//   - The repository wins on the container fields it sets: its image or its build replaces the spec's image
//     and build together (they are one choice: image xor build), its user replaces the spec's.
//   - Environment: the repository's env, less the deny class (DenyClass), then the spec's env over it per key.
//     Each key stripped from the repository's env is an Event (name and class, never the value). The spec's
//     and the overlay's env are the operator's and are not stripped.
//   - postCreate and workspaceFolder: the spec's when set, else the repository's; the repository's postCreate
//     is onCreateCommand, updateContentCommand and postCreateCommand in sequence (see sequence).
//   - postStart, postAttach, forwardPorts: the repository's (sandkeep.yaml has no spelling for them).
//   - tmpfs and volumes: the spec's, then the repository's on targets no mount, tmpfs or volume uses yet.
//   - Mounts: the spec's, then the repository's; a repository mount whose target a spec mount already uses
//     is dropped (the spec wins per target). Fuse does not check mounts again: Parse passed each repository
//     mount through guard.ParseMount and reported refusals as SK205 errors (with their line), and lifecycle
//     checks every mount with guard.CheckMount when it makes the sandbox. A Config built by hand must hold
//     only mounts that passed the guard.
//   - Last, the overlay wins on every field it sets: a non-empty string, a non-nil slice (replaces the list;
//     an empty non-nil slice clears it), each env key, and each non-zero field of resources and
//     network. Its image or build replaces the image and build together, as the repository's does.
//
// Events are in the order of the keys' names.
func Fuse(dc *Config, sp *spec.Sandbox, overlay *spec.Sandbox) (spec.Sandbox, []Event) {
	var out spec.Sandbox
	if sp != nil {
		out = cloneSandbox(*sp)
	}
	var events []Event
	if dc != nil {
		events = fuseRepository(&out, dc)
	}
	if overlay != nil {
		applyOverlay(&out, overlay)
	}
	return out, events
}

// fuseRepository lays the repository's file under (env, mounts, postCreate, workspaceFolder) and over
// (image, build, user) the spec in out.
func fuseRepository(out *spec.Sandbox, dc *Config) []Event {
	switch {
	case dc.Image != "":
		out.Image, out.Build = dc.Image, nil
	case dc.Build != nil:
		out.Image, out.Build = "", cloneBuild(dc.Build)
	}
	if dc.User != "" {
		out.User = dc.User
	}

	var events []Event
	env := map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(dc.Env)) {
		if class := DenyClass(k); class != "" {
			events = append(events, Event{Kind: EventEnvDenied, Key: k, Class: class, Source: SourceDevcontainer, File: dc.Path})
			continue
		}
		env[k] = dc.Env[k]
	}
	maps.Copy(env, out.Env) // the spec wins per key
	if len(env) > 0 {
		out.Env = env
	}

	if out.PostCreate == "" {
		out.PostCreate = sequence(dc.OnCreate, dc.UpdateContent, dc.PostCreate)
	}
	setString(&out.PostStart, dc.PostStart)
	setString(&out.PostAttach, dc.PostAttach)
	if len(dc.ForwardPorts) > 0 {
		out.ForwardPorts = slices.Clone(dc.ForwardPorts)
	}
	if out.WorkspaceFolder == "" {
		out.WorkspaceFolder = dc.WorkspaceFolder
	}

	taken := map[string]bool{}
	for _, m := range out.Mounts {
		taken[mountTarget(m)] = true
	}
	for _, m := range dc.Mounts {
		if t := mountTarget(m); t == "" || !taken[t] {
			out.Mounts = append(out.Mounts, m)
			taken[t] = true
		}
	}
	for _, t := range out.Tmpfs {
		target, _, _ := strings.Cut(t, ":")
		taken[target] = true
	}
	for _, v := range out.Volumes {
		taken[v.Target] = true
	}
	for _, t := range dc.Tmpfs {
		if target, _, _ := strings.Cut(t, ":"); !taken[target] {
			out.Tmpfs = append(out.Tmpfs, t)
			taken[target] = true
		}
	}
	for _, v := range dc.Volumes {
		if !taken[v.Target] {
			out.Volumes = append(out.Volumes, spec.Volume{Name: v.Name, Target: v.Target, ReadOnly: v.ReadOnly})
			taken[v.Target] = true
		}
	}
	return events
}

// sequence joins lifecycle command lines run one after another, stopping at the first that fails with its
// status: onCreateCommand, updateContentCommand, then postCreateCommand, as the devcontainer CLI runs them.
func sequence(cmds ...string) string {
	var parts []string
	for _, c := range cmds {
		if c != "" {
			parts = append(parts, c)
		}
	}
	if len(parts) <= 1 {
		return strings.Join(parts, "")
	}
	for i, c := range parts {
		parts[i] = "( " + c + "\n) || exit $?"
	}
	return strings.Join(parts, "\n")
}

// applyOverlay lays the operator's overlay over out.
func applyOverlay(out *spec.Sandbox, ov *spec.Sandbox) {
	setString(&out.Mode, ov.Mode)
	if ov.Image != "" || ov.Build != nil {
		out.Image, out.Build = ov.Image, cloneBuild(ov.Build)
	}
	setString(&out.User, ov.User)
	if len(ov.Env) > 0 {
		if out.Env == nil {
			out.Env = map[string]string{}
		}
		maps.Copy(out.Env, ov.Env)
	}
	if ov.Mounts != nil {
		out.Mounts = slices.Clone(ov.Mounts)
	}
	if ov.Tmpfs != nil {
		out.Tmpfs = slices.Clone(ov.Tmpfs)
	}
	if ov.Resources != nil {
		if out.Resources == nil {
			out.Resources = &spec.Resources{}
		}
		if ov.Resources.CPUs != 0 {
			out.Resources.CPUs = ov.Resources.CPUs
		}
		setString(&out.Resources.Memory, ov.Resources.Memory)
		if ov.Resources.Pids != 0 {
			out.Resources.Pids = ov.Resources.Pids
		}
	}
	setString(&out.PostCreate, ov.PostCreate)
	setString(&out.WorkspaceFolder, ov.WorkspaceFolder)
	setString(&out.HostState, ov.HostState)
	if ov.SecretFiles != nil {
		out.SecretFiles = slices.Clone(ov.SecretFiles)
	}
	if ov.Network != nil {
		if out.Network == nil {
			out.Network = &spec.Network{}
		}
		setString(&out.Network.Mode, ov.Network.Mode)
		setString(&out.Network.Preset, ov.Network.Preset)
		setString(&out.Network.Inherit, ov.Network.Inherit)
		if ov.Network.Rules != nil {
			out.Network.Rules = slices.Clone(ov.Network.Rules)
		}
	}
}

func setString(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}

// mountTarget returns the target of a --mount string, or "" when it has none.
func mountTarget(m string) string {
	for _, f := range strings.Split(m, ",") {
		k, v, _ := strings.Cut(f, "=")
		switch strings.ToLower(k) {
		case "target", "dst", "destination":
			return v
		}
	}
	return ""
}

// cloneSandbox deep-copies s, so Fuse never aliases its inputs.
func cloneSandbox(s spec.Sandbox) spec.Sandbox {
	s.Build = cloneBuild(s.Build)
	s.Env = maps.Clone(s.Env)
	s.Mounts = slices.Clone(s.Mounts)
	s.Tmpfs = slices.Clone(s.Tmpfs)
	s.Volumes = slices.Clone(s.Volumes)
	s.ForwardPorts = slices.Clone(s.ForwardPorts)
	if s.Resources != nil {
		r := *s.Resources
		s.Resources = &r
	}
	s.SecretFiles = slices.Clone(s.SecretFiles)
	if s.Network != nil {
		n := *s.Network
		n.Rules = slices.Clone(n.Rules)
		s.Network = &n
	}
	return s
}

func cloneBuild(b *spec.Build) *spec.Build {
	if b == nil {
		return nil
	}
	c := *b
	c.Args = maps.Clone(b.Args)
	return &c
}
