// Package compose reads the compose file(s) a compose-based devcontainer.json names (dockerComposeFile,
// service, runServices) with github.com/compose-spec/compose-go/v2, and keeps only what one sandbox and its
// companions on the local engine need: image, build, environment, command, user (the sandbox's service), named
// volumes (per key), healthcheck and depends_on. Everything else a service sets is dropped and reported
// (Dropped): what would weaken the posture (privileged, cap_add, network_mode, ports, devices, host binds,
// security_opt, pid/ipc namespaces) with why, the rest as not supported.
//
// The files are the repository's: they are read through an os.Root (no symlink out of the repository),
// bounded, never with the host's environment for interpolation (${VAR} takes its default, or ""), and with
// include, extends and env_file not followed (they would read other files).
package compose

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// compose-go reports what it ignores (an obsolete "version:", ...) through logrus's global logger, which would
// print on the stderr of whoever runs sandkeep; what matters to us comes back as errors or as Dropped.
func init() { logrus.SetLevel(logrus.ErrorLevel) }

// MaxFileBytes bounds one compose file.
const MaxFileBytes = 1 << 20

// Dropped is one setting of a service that is not applied, and why.
type Dropped struct {
	Service string
	Field   string
	Why     string
}

// Service is what sandkeep takes of one compose service.
type Service struct {
	Name        string
	Image       string      // xor Build
	Build       *spec.Build // paths relative to the repository root
	Env         map[string]string
	Command     []string // nil: the image's
	User        string
	Volumes     []driver.CompanionVolume
	Healthcheck *driver.Healthcheck
	DependsOn   []string
}

// Project is the sandbox's service, the companions runServices names (every other service when it is not
// given), and what was dropped.
type Project struct {
	Sandbox    Service
	Companions []Service
	Dropped    []Dropped
}

// allowed are the service keys that are applied (name is compose-go's own).
var allowed = map[string]bool{"image": true, "build": true, "environment": true, "command": true, "user": true,
	"volumes": true, "healthcheck": true, "depends_on": true}

// weakening says why a key that weakens the posture is dropped.
var weakening = map[string]string{
	"privileged":   "a sandbox or companion is never privileged",
	"cap_add":      "every capability is dropped",
	"security_opt": "seccomp and no-new-privileges are sandkeep's",
	"network_mode": "companions share the sandbox's network namespace and have none of their own",
	"networks":     "companions share the sandbox's network namespace and have none of their own",
	"ports":        "nothing is published: reach a companion at localhost from the sandbox",
	"expose":       "nothing is published: reach a companion at localhost from the sandbox",
	"devices":      "no host device is passed in",
	"pid":          "no host or shared PID namespace",
	"ipc":          "no host or shared IPC namespace",
	"userns_mode":  "the user namespace is the engine's default",
	"cgroup":       "the cgroup namespace is the engine's default",
	"runtime":      "the runtime is the operator's",
	"sysctls":      "kernel parameters are not set",
	"ulimits":      "limits are the operator's",
	"gpus":         "GPUs are the operator's to offer",
	"extra_hosts":  "the sandbox's name resolution is sandkeep's",
	"volumes_from": "a service mounts only its own per-key volumes",
	"entrypoint":   "the sandbox's entrypoint is sandkeep's agent",
}

// Load reads files (relative to the repository root, slash-separated) through repo, and returns service as
// the sandbox with runServices (nil: all others) as companions. Errors are COMPOSE_INVALID.
func Load(ctx context.Context, repo *os.Root, files []string, service string, runServices []string) (*Project, error) {
	if len(files) == 0 {
		return nil, invalid("name the compose file in dockerComposeFile", "no compose file is named")
	}
	var cfs []types.ConfigFile
	for _, f := range files {
		data, err := readFile(repo, f)
		if err != nil {
			return nil, fault.Wrap(err, fault.ComposeInvalid, "keep the compose file a regular file inside the repository, under 1 MiB",
				"compose file %s cannot be read: %v", f, err)
		}
		cfs = append(cfs, types.ConfigFile{Filename: f, Content: data})
	}
	dir := path.Dir(files[0]) // compose's project directory: relative paths in the files are relative to it
	proj, err := loader.LoadWithContext(ctx, types.ConfigDetails{WorkingDir: dir, ConfigFiles: cfs, Environment: types.Mapping{}},
		func(o *loader.Options) {
			o.SkipInclude, o.SkipExtends, o.SkipResolveEnvironment, o.SkipConsistencyCheck = true, true, true, true
			o.SkipNormalization, o.ResolvePaths = true, false
			o.SetProjectName("sandkeep", false)
		})
	if err != nil {
		return nil, fault.Wrap(err, fault.ComposeInvalid, "fix the compose file; `docker compose config` shows how it reads",
			"compose files %s: %v", strings.Join(files, ", "), err)
	}
	p := &Project{}
	main, ok := proj.Services[service]
	if !ok {
		return nil, invalid("name one of the services: "+strings.Join(slices.Sorted(maps.Keys(proj.Services)), ", "),
			"service %q is not in %s", service, strings.Join(files, ", "))
	}
	if p.Sandbox, err = p.take(main, dir, true); err != nil {
		return nil, err
	}
	names := runServices
	if names == nil {
		for n := range proj.Services {
			if n != service {
				names = append(names, n)
			}
		}
		slices.Sort(names)
	}
	for _, n := range names {
		if n == service {
			continue
		}
		svc, ok := proj.Services[n]
		if !ok {
			return nil, invalid("name services the compose file defines in runServices", "runServices names %q, which is not defined", n)
		}
		c, err := p.take(svc, dir, false)
		if err != nil {
			return nil, err
		}
		p.Companions = append(p.Companions, c)
	}
	return p, nil
}

// take maps one service, dropping what is not applied.
func (p *Project) take(svc types.ServiceConfig, dir string, sandbox bool) (Service, error) {
	s := Service{Name: svc.Name, Image: svc.Image, User: svc.User}
	drop := func(field, why string) {
		p.Dropped = append(p.Dropped, Dropped{Service: svc.Name, Field: field, Why: why})
	}
	raw, err := json.Marshal(svc)
	if err != nil {
		return s, invalid("", "service %q: %v", svc.Name, err)
	}
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(raw, &fields)
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		v := strings.TrimSpace(string(fields[k]))
		if allowed[k] || v == "null" || v == "" || v == "{}" || v == "[]" || v == `""` || v == "false" || v == "0" {
			continue
		}
		if why, ok := weakening[k]; ok {
			drop(k, why)
		} else {
			drop(k, "not supported by sandkeep; ignored")
		}
	}
	if svc.Build != nil {
		if s.Image != "" {
			drop("image", "build is given: the image is built")
			s.Image = ""
		}
		b, err := buildOf(svc, dir)
		if err != nil {
			return s, err
		}
		s.Build = b
	}
	if s.Image == "" && s.Build == nil {
		return s, invalid("give the service an image or a build", "service %q has neither image nor build", svc.Name)
	}
	if len(svc.Environment) > 0 {
		s.Env = map[string]string{}
		for k, v := range svc.Environment {
			if v != nil {
				s.Env[k] = *v
			}
		}
	}
	if svc.Command != nil {
		s.Command = slices.Clone([]string(svc.Command))
	}
	if !sandbox && s.User != "" {
		drop("user", "a companion runs as the sandbox's uid")
		s.User = ""
	}
	for i, v := range svc.Volumes {
		field := fmt.Sprintf("volumes[%d]", i)
		switch {
		case v.Type == types.VolumeTypeVolume && v.Source != "" && path.IsAbs(v.Target):
			if sandbox {
				drop(field, "the sandbox's volumes are devcontainer.json's mounts")
				continue
			}
			s.Volumes = append(s.Volumes, driver.CompanionVolume{Name: v.Source, Target: v.Target})
		case v.Type == types.VolumeTypeBind:
			drop(field, "a service binds no host path (the workspace is sandkeep's)")
		default:
			drop(field, fmt.Sprintf("a %s volume is not made", v.Type))
		}
	}
	if h := svc.HealthCheck; h != nil && !h.Disable && len(h.Test) > 0 && h.Test[0] != "NONE" {
		hc := &driver.Healthcheck{Test: slices.Clone([]string(h.Test))}
		if h.Interval != nil {
			hc.Interval = time.Duration(*h.Interval)
		}
		if h.Timeout != nil {
			hc.Timeout = time.Duration(*h.Timeout)
		}
		if h.Retries != nil {
			hc.Retries = int(min(*h.Retries, 100))
		}
		if sandbox {
			drop("healthcheck", "the sandbox's readiness is its agent's")
		} else {
			s.Healthcheck = hc
		}
	}
	for _, dep := range slices.Sorted(maps.Keys(svc.DependsOn)) {
		if sandbox {
			continue // the sandbox starts first; its companions follow in their own order
		}
		s.DependsOn = append(s.DependsOn, dep)
	}
	return s, nil
}

// buildOf turns a service's build into a spec.Build relative to the repository root.
func buildOf(svc types.ServiceConfig, dir string) (*spec.Build, error) {
	b := svc.Build
	ctxDir := b.Context
	if ctxDir == "" {
		ctxDir = "."
	}
	if filepath.IsAbs(ctxDir) || strings.Contains(ctxDir, "://") {
		return nil, invalid("give build.context relative to the compose file, inside the repository", "service %q: build context %q is not a path inside the repository", svc.Name, ctxDir)
	}
	rel := path.Clean(path.Join(dir, ctxDir))
	if rel != "." && !filepath.IsLocal(filepath.FromSlash(rel)) {
		return nil, invalid("keep the build context inside the repository", "service %q: build context %q is outside the repository", svc.Name, ctxDir)
	}
	df := b.Dockerfile
	if df == "" {
		df = "Dockerfile"
	}
	dfRel := path.Clean(path.Join(rel, df))
	if filepath.IsAbs(df) || (dfRel != "." && !filepath.IsLocal(filepath.FromSlash(dfRel))) {
		return nil, invalid("keep the Dockerfile inside the repository", "service %q: dockerfile %q is outside the repository", svc.Name, df)
	}
	out := &spec.Build{Context: rel, Dockerfile: dfRel}
	for k, v := range b.Args {
		if out.Args == nil {
			out.Args = map[string]string{}
		}
		if v != nil {
			out.Args[k] = *v
		}
	}
	return out, nil
}

func readFile(repo *os.Root, name string) ([]byte, error) {
	f, err := repo.Open(filepath.FromSlash(name))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file")
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxFileBytes)
	}
	return data, nil
}

func invalid(hint, format string, args ...any) error {
	return fault.New(fault.ComposeInvalid, hint, format, args...)
}
