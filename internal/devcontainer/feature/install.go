package feature

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sandkeep/sandkeep/internal/build"
	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
)

// Dropped is one thing a feature's metadata asked for that sandkeep does not do, and why. It never carries a
// variable's value.
type Dropped struct {
	Feature string // the feature as devcontainer.json names it
	Field   string // "privileged", "capAdd", "securityOpt", "entrypoint", "init", "mounts[1]", "containerEnv.LD_PRELOAD", "postCreateCommand"
	Why     string
}

// Plan is what installing features adds to the sandbox: the environment and mounts their metadata ask for
// (after screening), and what was dropped.
type Plan struct {
	Features []*Feature
	Env      map[string]string     // containerEnv of the features, later features winning; also ENV in the image
	Volumes  []devcontainer.Volume // type=volume mounts: per-key named volumes, as devcontainer.json's own
	Tmpfs    []string              // type=tmpfs mounts, "target[:size=N]"
	Dropped  []Dropped
}

// Scope is what the screening of a feature's mounts needs of the devcontainer: the container's workspace folder
// (no volume may take its place) and the variables ${devcontainerId} and the rest expand from.
type Scope struct {
	Workspace string
	Env       devcontainer.Env
}

// Screen applies the posture screening to the features' metadata, in install order. A feature's mounts go
// through devcontainer.FeatureMount: volumes and tmpfs mounts are made, binds dropped.
func Screen(fs []*Feature, sc Scope) *Plan {
	p := &Plan{Features: fs, Env: map[string]string{}}
	drop := func(f *Feature, field, why string) {
		p.Dropped = append(p.Dropped, Dropped{Feature: f.Ref.ID, Field: field, Why: why})
	}
	for _, f := range fs {
		m := f.Meta
		if m.Privileged != nil && *m.Privileged {
			drop(f, "privileged", "a sandbox is never privileged")
		}
		for _, c := range m.CapAdd {
			drop(f, "capAdd", fmt.Sprintf("capability %s is not added: a sandbox drops every capability", short(c)))
		}
		for _, s := range m.SecurityOpt {
			drop(f, "securityOpt", fmt.Sprintf("%s is not applied: the sandbox's seccomp and no-new-privileges are sandkeep's", short(s)))
		}
		if m.Entrypoint != "" {
			drop(f, "entrypoint", "the sandbox's entrypoint is sandkeep's agent; a feature's daemon is not started")
		}
		if m.Init != nil && *m.Init {
			drop(f, "init", "sandkeep's agent reaps the sandbox's processes")
		}
		for name, raw := range map[string]json.RawMessage{"onCreateCommand": m.OnCreateCommand, "updateContentCommand": m.UpdateContentCommand,
			"postCreateCommand": m.PostCreateCommand, "postStartCommand": m.PostStartCommand, "postAttachCommand": m.PostAttachCommand} {
			if len(raw) > 0 && string(raw) != "null" {
				drop(f, name, "a feature's lifecycle commands are not run; put the command in devcontainer.json")
			}
		}
		for _, k := range slices.Sorted(maps.Keys(m.ContainerEnv)) {
			v := m.ContainerEnv[k]
			if class := devcontainer.DenyClass(k); class != "" {
				drop(f, "containerEnv."+k, "the variable is in the "+class+" deny class")
				continue
			}
			if err := guard.EnvVar(k, v); err != nil {
				drop(f, "containerEnv."+k, message(err))
				continue
			}
			p.Env[k] = v
		}
		for i, raw := range m.Mounts {
			field := fmt.Sprintf("mounts[%d]", i)
			s, err := mountString(raw)
			if err != nil {
				drop(f, field, message(err))
				continue
			}
			got := devcontainer.FeatureMount(s, cmp.Or(sc.Workspace, "/workspace"), sc.Env)
			if got.Why != "" {
				drop(f, field, got.Why)
			}
			switch {
			case got.Volume != nil:
				p.Volumes = append(p.Volumes, *got.Volume)
			case got.Tmpfs != "":
				p.Tmpfs = append(p.Tmpfs, got.Tmpfs)
			}
		}
	}
	slices.SortStableFunc(p.Dropped, func(a, b Dropped) int { return strings.Compare(a.Feature, b.Feature) })
	return p
}

// mountString turns a mount of the metadata ({type, source, target} or a --mount string) into --mount syntax.
func mountString(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var o struct{ Type, Source, Target string }
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", fmt.Errorf("the mount is neither a string nor {type, source, target}")
	}
	for _, v := range []string{o.Type, o.Source, o.Target} {
		if strings.Contains(v, ",") {
			return "", fmt.Errorf("the mount has a comma in a field")
		}
	}
	parts := []string{"type=" + o.Type}
	if o.Source != "" {
		parts = append(parts, "source="+o.Source)
	}
	return strings.Join(append(parts, "target="+o.Target), ","), nil
}

// Request is one derived-image build.
type Request struct {
	Base   string // the image the features are installed on (a ref the engine has, or can pull)
	BaseID string // its image ID when known: part of the digest, so a moved tag builds again
	// The users install.sh is told of, found as the devcontainers CLI finds them: _CONTAINER_USER is
	// containerUser, else the compose service's user, else the base image's USER, else root; _REMOTE_USER is
	// remoteUser, else _CONTAINER_USER. Users names them as given; Install applies the fallbacks.
	Users Users
}

// Users are the user names a devcontainer gives (each "" when not given).
type Users struct {
	Remote, Container, Compose, Image string
}

// resolve returns _CONTAINER_USER and _REMOTE_USER.
func (u Users) resolve() (container, remote string) {
	container = cmp.Or(u.Container, u.Compose, u.Image, "root")
	return container, cmp.Or(u.Remote, container)
}

// stage is where a feature's files go in the image while its install.sh runs.
const stage = "/tmp/sandkeep-features"

// Dockerfile is the derived image's Dockerfile for p: the base, then per feature a COPY of its files, a RUN of
// its install.sh as root with its options in the environment, and its (screened) containerEnv as ENV.
func Dockerfile(req Request, p *Plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "FROM %s\n", req.Base)
	if req.BaseID != "" {
		fmt.Fprintf(&b, "LABEL io.sandkeep.feature-base=%s\n", strconv.Quote(req.BaseID))
	}
	b.WriteString("USER root\n")
	// Before any feature, as the devcontainers CLI does: the two users' homes, from the base image's user database.
	fmt.Fprintf(&b, "COPY %s %s/%s\nRUN sh %s/%s\n", homesScript, stage, homesScript, stage, homesScript)
	for i, f := range p.Features {
		dir := fmt.Sprintf("%s/%d", stage, i)
		fmt.Fprintf(&b, "COPY features/%d/ %s/\n", i, dir)
		fmt.Fprintf(&b, "RUN cd %s && chmod +x ./%s && set -a && . ./devcontainer-features-builtin.env && . %s/%s && . ./devcontainer-features.env && set +a && ./%s && cd / && rm -rf %s\n",
			dir, InstallScript, stage, homesEnv, InstallScript, dir)
		var env []string
		for _, k := range slices.Sorted(maps.Keys(f.Meta.ContainerEnv)) {
			if v, ok := p.Env[k]; ok && v == f.Meta.ContainerEnv[k] {
				env = append(env, k+"="+dockerfileQuote(v))
			}
		}
		if len(env) > 0 {
			fmt.Fprintf(&b, "ENV %s\n", strings.Join(env, " "))
		}
	}
	fmt.Fprintf(&b, "RUN rm -rf %s\n", stage)
	return b.String()
}

// homesScript, run before the features, writes homesEnv: _CONTAINER_USER_HOME and _REMOTE_USER_HOME, each the
// sixth field of the user's passwd entry (by name or uid; getent when the image has it, else /etc/passwd), ""
// when there is none or it holds a quote.
const (
	homesScript = "devcontainer-features-homes.sh"
	homesEnv    = "devcontainer-features-homes.env"
)

func homes(u Users) []byte {
	container, remote := u.resolve()
	return []byte(`set -e
home() {
	e=""
	if command -v getent >/dev/null 2>&1; then e=$(getent passwd "$1" || true); fi
	if [ -z "$e" ] && [ -r /etc/passwd ]; then
		while IFS= read -r line; do
			n=${line%%:*}; rest=${line#*:}; rest=${rest#*:}; id=${rest%%:*}
			if [ "$n" = "$1" ] || [ "$id" = "$1" ]; then e=$line; break; fi
		done < /etc/passwd
	fi
	h=$(printf '%s\n' "$e" | cut -d: -f6)
	case $h in *"'"*) h="" ;; esac
	printf '%s' "$h"
}
{
	printf "_CONTAINER_USER_HOME='%s'\n" "$(home ` + shellQuote(container) + `)"
	printf "_REMOTE_USER_HOME='%s'\n" "$(home ` + shellQuote(remote) + `)"
} > ` + stage + `/` + homesEnv + `
`)
}

// dockerfileQuote double-quotes v for ENV: ${VAR} references are left for the builder to expand, as the
// devcontainers CLI relies on (PATH="/usr/local/go/bin:${PATH}").
func dockerfileQuote(v string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(v) + `"`
}

// envFile is a POSIX-shell file of assignments, each value single-quoted.
func envFile(env map[string]string) []byte {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(env)) {
		fmt.Fprintf(&b, "%s=%s\n", k, shellQuote(env[k]))
	}
	return []byte(b.String())
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Install builds the derived image: the features of p on req.Base, through b (the driver's build path, so RUN
// has the build's network policy: none). It returns the image's ref. The build context is a temporary
// directory removed before Install returns; the image is tagged by the digest of that context, so the same
// base, features and options reuse the image.
func Install(ctx context.Context, b build.Builder, req Request, p *Plan, progress io.Writer) (string, error) {
	if len(p.Features) == 0 {
		return req.Base, nil
	}
	dir, err := os.MkdirTemp("", "sandkeep-features-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	container, remote := req.Users.resolve()
	builtin := envFile(map[string]string{"_REMOTE_USER": remote, "_CONTAINER_USER": container})
	if err := writeFile(dir, homesScript, homes(req.Users), 0o644); err != nil {
		return "", err
	}
	for i, f := range p.Features {
		root := filepath.Join(dir, "features", strconv.Itoa(i))
		for _, fl := range f.Files {
			if err := copyFile(root, fl); err != nil {
				return "", err
			}
		}
		if err := writeFile(root, "devcontainer-features.env", envFile(f.Options), 0o644); err != nil {
			return "", err
		}
		if err := writeFile(root, "devcontainer-features-builtin.env", builtin, 0o644); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(Dockerfile(req, p)), 0o644); err != nil {
		return "", err
	}
	ref, _, err := b.Build(ctx, build.Request{Root: dir, Dockerfile: "Dockerfile", Context: "."}, progress)
	if err != nil {
		names := make([]string, len(p.Features))
		for i, f := range p.Features {
			names[i] = f.Ref.ID
		}
		return "", fmt.Errorf("install features %s: %w", strings.Join(names, ", "), err)
	}
	return ref, nil
}

func writeFile(root, rel string, data []byte, mode os.FileMode) error {
	p := filepath.Join(root, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, data, mode|0o400)
}

// copyFile writes fl under root, streaming a spooled file rather than reading it into memory.
func copyFile(root string, fl File) error {
	if fl.spooled == "" {
		return writeFile(root, fl.Path, fl.Data, fl.Mode)
	}
	p := filepath.Join(root, filepath.FromSlash(fl.Path))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	in, err := fl.Open()
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fl.Mode|0o400)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// message is the sentence of a refusal, without its code and hint.
func message(err error) string {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return fe.Message
	}
	return err.Error()
}
