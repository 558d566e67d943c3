package engine

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
)

// Host state modes (Config.HostState, Template.HostState, RunRequest.HostState): the operator's own state a
// local developer's sandbox may use. Operator tier only: a repository's host_state is TIER_REFUSED.
const (
	HostStateNone = "none" // nothing bound; the operator's git identity as GIT_AUTHOR_* and GIT_COMMITTER_*
	HostStateAuto = "auto" // the git identity and tool caches bound at their own paths under a tmpfs HOME at the operator's home
)

// DefaultHostStatePaths are host_state auto's candidates under the operator's home, when Config.HostStatePaths
// is empty: the git identity and the Go, npm, pnpm and yarn caches. "~/" is the operator's home.
var DefaultHostStatePaths = []string{
	"~/.gitconfig", "~/.config/git/config", // git identity (read-only)
	"~/go/pkg/mod", "~/.cache/go-build", // Go: module cache, build cache
	"~/.npm", "~/.local/share/pnpm/store", "~/.cache/yarn",
}

// gitIdentity names the files that carry the git identity: bound read-only, never written from a sandbox.
var gitIdentity = map[string]bool{".gitconfig": true, "config": true}

// hostState is what host_state gives a run's shape: the sandbox's HOME, binds, variables, and the event.
type hostState struct {
	mode  string
	home  string
	binds []driver.Mount
	env   []string
	event *events.HostStateMounted
}

// resolveHostState decides the run's host_state: the request's (the CLI's --host-state), else its template's,
// else the Config's; "" is none of it. auto needs a driver that binds host paths (not kubernetes: no host file
// system there).
func (m *Manager) resolveHostState(ctx context.Context, rr RunRequest, tpl *template, d driver.Driver, workspace string) (*hostState, error) {
	mode := m.cfg.HostState
	if tpl != nil && tpl.HostState != "" {
		mode = tpl.HostState
	}
	if rr.HostState != "" {
		mode = rr.HostState
	}
	switch mode {
	case "":
		return nil, nil
	case HostStateNone, HostStateAuto:
	default:
		return nil, fault.New(fault.InvalidArgument, "use host_state auto or none", "host_state %q is not auto or none", mode)
	}
	if rr.Caller && rr.HostState != "" {
		return nil, fault.New(fault.TierRefused, "host state is the operator's to give: set host_state in the operator's config or a template",
			"a caller may not ask for host_state")
	}
	home := m.cfg.HostStateHome
	if home == "" {
		h, err := os.UserHomeDir()
		if err != nil {
			return nil, fault.Wrap(err, fault.InvalidArgument, "set HOME, or the operator's host_state_home", "host_state: the operator's home is unknown: %v", err)
		}
		home = h
	}
	home = filepath.Clean(home)
	hs := &hostState{mode: mode, home: home}
	if mode == HostStateNone {
		hs.env = gitIdentityEnv(ctx, home)
		return hs, nil
	}
	if !d.Capabilities().HostBinds {
		return nil, fault.New(fault.SpecUnsupported, "use host_state none on this driver (the git identity is passed as GIT_* variables), or run on docker",
			"host_state auto binds the operator's files, and the %s driver has no host file system to bind them from", d.Name())
	}
	hs.event = &events.HostStateMounted{Mode: mode, Home: home}
	paths := m.cfg.HostStatePaths
	if len(paths) == 0 {
		paths = DefaultHostStatePaths
	}
	for _, p := range paths {
		src := p
		if rest, ok := strings.CutPrefix(p, "~/"); ok {
			src = filepath.Join(home, rest)
		}
		src = filepath.Clean(src)
		skip := func(why string) {
			hs.event.Skipped = append(hs.event.Skipped, events.HostStatePath{Path: src, Why: why})
		}
		switch {
		case !filepath.IsAbs(src):
			skip("not an absolute path")
			continue
		case within(src, workspace) || within(workspace, src):
			skip("nested in or containing the workspace")
			continue
		}
		fi, err := os.Stat(src)
		if err != nil {
			skip("missing on the host")
			continue
		}
		ro := !fi.IsDir() && gitIdentity[filepath.Base(src)]
		mnt := driver.Mount{Source: src, Target: src, ReadOnly: ro}
		if err := guard.CheckMount(mnt); err != nil {
			skip("refused by the mount guard: " + err.Error())
			continue
		}
		hs.binds = append(hs.binds, mnt)
		hs.event.Bound = append(hs.event.Bound, events.HostStatePath{Path: src, ReadOnly: ro})
	}
	return hs, nil
}

// apply puts the host state into a shape's Config.
func (hs *hostState) apply(c *lifecycle.Config) {
	if hs == nil {
		return
	}
	c.Env = append(c.Env, hs.env...)
	if hs.mode == HostStateAuto {
		c.HomeDir = hs.home
		c.Mounts = append(c.Mounts, hs.binds...)
	}
}

// within reports whether p is dir or under it.
func within(p, dir string) bool {
	if dir == "" {
		return false
	}
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// gitIdentityEnv is the operator's git identity (user.name, user.email of its global config) as the four
// variables git reads before any config, for host_state none. Without git or an identity: none of them.
func gitIdentityEnv(ctx context.Context, home string) []string {
	get := func(key string) string {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "git", "config", "--global", "--get", key)
		cmd.Env = []string{"HOME=" + home, "GIT_CONFIG_NOSYSTEM=1", "PATH=" + os.Getenv("PATH")}
		out, err := cmd.Output()
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(out))
	}
	var env []string
	if name := get("user.name"); name != "" {
		env = append(env, "GIT_AUTHOR_NAME="+name, "GIT_COMMITTER_NAME="+name)
	}
	if email := get("user.email"); email != "" {
		env = append(env, "GIT_AUTHOR_EMAIL="+email, "GIT_COMMITTER_EMAIL="+email)
	}
	return env
}
