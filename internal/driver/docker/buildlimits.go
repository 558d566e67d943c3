package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// Limits of a build's RUN steps beyond memory and CPU (issue 22, finding 3: a RUN step spawned 700 processes,
// and 2 GiB allows more threads than the host's pid_max). The engine's build API has no pids limit, so the
// steps of one build are put under a cgroup of their own (CgroupParent) whose pids.max is buildPids: every
// intermediate container of the build is a child of it and they share the bound. nofile and core are the
// sandbox's ulimits (Config.NofileLimit's default, no core files).
const (
	buildPids      = 512
	buildNofile    = 8192
	buildCgroupDir = "sandkeep-build" // under the pids hierarchy's root; each build makes a directory in it
)

// BuildLimits says which of the sandbox's limits a build's RUN steps get on this engine; doctor reports it
// ("build limits") and Build applies it.
type BuildLimits struct {
	// Pids is the bound on one build's processes together (buildPids), 0 when the engine's builds cannot be put
	// under a pids-limited cgroup; PidsOff then says why.
	Pids    int64
	PidsOff string
	// Seccomp is the profile RUN steps run under: the engine refuses a seccomp option on a Linux build, so it
	// is the daemon's default profile, "default" (the engine's built-in one: io_uring and ptrace allowed before
	// Docker 25) or the path the daemon's seccomp-profile names.
	Seccomp string
	// Nofile and core ulimits are always applied (the build API has them).
	Nofile int64
}

// buildCgroups is where builds' cgroups are made on this host; found once per Driver (buildLimitsOnce).
type buildCgroups struct {
	pidsRoot string // the pids hierarchy's mount on this host: /sys/fs/cgroup/pids (v1) or /sys/fs/cgroup (v2)
	v2       bool
}

// buildLimits finds out, once, what BuildLimits are and where builds' cgroups go.
func (d *Driver) buildLimits(ctx context.Context) (BuildLimits, buildCgroups) {
	d.buildOnce.Do(func() { d.limits, d.cgroups = d.findBuildLimits(ctx) })
	return d.limits, d.cgroups
}

// BuildLimits reports the limits a build's RUN steps get on this engine.
func (d *Driver) BuildLimits(ctx context.Context) BuildLimits {
	l, _ := d.buildLimits(ctx)
	return l
}

func (d *Driver) findBuildLimits(ctx context.Context) (BuildLimits, buildCgroups) {
	l := BuildLimits{Nofile: buildNofile, Seccomp: "default"}
	api, ok := d.api.(interface {
		Info(ctx context.Context, opts client.InfoOptions) (client.SystemInfoResult, error)
	})
	if !ok {
		l.PidsOff = "the engine client cannot report its cgroup driver"
		return l, buildCgroups{}
	}
	res, err := api.Info(ctx, client.InfoOptions{})
	if err != nil {
		l.PidsOff = fmt.Sprintf("the engine's info: %v", err)
		return l, buildCgroups{}
	}
	l.Seccomp = seccompProfile(res.Info.SecurityOptions)
	var host string
	if h, ok := d.api.(interface{ DaemonHost() string }); ok {
		host = h.DaemonHost()
	}
	cg, off := pidsHierarchy(res.Info.CgroupDriver, res.Info.CgroupVersion, host, os.Geteuid(), "/sys/fs/cgroup")
	if off != "" {
		l.PidsOff = off
		return l, buildCgroups{}
	}
	l.Pids = buildPids
	return l, cg
}

// seccompProfile is the daemon's default seccomp profile from its security options
// ("name=seccomp,profile=default"), "" when it reports no seccomp.
func seccompProfile(opts []string) string {
	for _, opt := range opts {
		if securityOptionName(opt) != "seccomp" {
			continue
		}
		for _, kv := range strings.Split(opt, ",") {
			if p, ok := strings.CutPrefix(kv, "profile="); ok {
				return p
			}
		}
		return "default"
	}
	return ""
}

// pidsHierarchy decides whether builds can get a pids-limited cgroup parent: the engine must place containers
// by cgroup path (the cgroupfs driver; systemd wants a slice whose limit only systemd sets), run on this host
// (a unix socket: its cgroup tree is ours), and sandkeep must be root to make the directory. off says why not.
func pidsHierarchy(cgroupDriver, cgroupVersion, daemonHost string, euid int, sysfs string) (buildCgroups, string) {
	switch {
	case cgroupDriver != "cgroupfs":
		return buildCgroups{}, fmt.Sprintf("the engine's cgroup driver is %q; a build's cgroup parent gets a pids limit only with cgroupfs", cgroupDriver)
	case daemonHost != "" && !strings.HasPrefix(daemonHost, "unix://"):
		return buildCgroups{}, fmt.Sprintf("the engine at %s is not on this host, so sandkeep cannot make its builds' cgroup", daemonHost)
	case euid != 0:
		return buildCgroups{}, "sandkeep does not run as root, so it cannot make the builds' cgroup"
	}
	if cgroupVersion == "2" {
		if c, err := os.ReadFile(filepath.Join(sysfs, "cgroup.subtree_control")); err != nil || !strings.Contains(" "+string(c), " pids") {
			return buildCgroups{}, "the root cgroup does not delegate the pids controller"
		}
		return buildCgroups{pidsRoot: sysfs, v2: true}, ""
	}
	root := filepath.Join(sysfs, "pids")
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		return buildCgroups{}, fmt.Sprintf("no cgroup v1 pids hierarchy at %s", root)
	}
	return buildCgroups{pidsRoot: root}, ""
}

// make creates one build's cgroup with pids.max set and returns the parent to name to the engine and a remove
// that deletes it (and the directories the engine made for it in the other v1 hierarchies) once the build's
// containers are gone.
func (cg buildCgroups) make() (parent string, remove func(), err error) {
	if cg.pidsRoot == "" {
		return "", func() {}, nil
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	name := hex.EncodeToString(b[:])
	base := filepath.Join(cg.pidsRoot, buildCgroupDir)
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", nil, fmt.Errorf("build cgroup: %w", err)
	}
	if cg.v2 {
		// The children's pids.max exist only when this level delegates pids to them.
		if err := os.WriteFile(filepath.Join(base, "cgroup.subtree_control"), []byte("+pids"), 0); err != nil {
			return "", nil, fmt.Errorf("build cgroup: delegate pids: %w", err)
		}
	}
	dir := filepath.Join(base, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("build cgroup: %w", err)
	}
	remove = func() { cg.remove(name) }
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.Itoa(buildPids)), 0); err != nil {
		remove()
		return "", nil, fmt.Errorf("build cgroup: pids.max: %w", err)
	}
	return "/" + buildCgroupDir + "/" + name, remove, nil
}

// remove deletes build name's directories: the pids one, and on v1 those the engine made under every other
// hierarchy for the same parent. A directory a process still holds stays (rmdir refuses it); nothing else is
// lost by that.
func (cg buildCgroups) remove(name string) {
	dirs := []string{filepath.Join(cg.pidsRoot, buildCgroupDir, name)}
	if !cg.v2 {
		others, _ := filepath.Glob(filepath.Join(filepath.Dir(cg.pidsRoot), "*", buildCgroupDir, name))
		dirs = append(dirs, others...)
	}
	for _, dir := range dirs {
		// The engine removes its containers' own directories with them; what is left are empty levels.
		_ = os.Remove(dir)
	}
}

// buildUlimits are a RUN step's ulimits: the sandbox's nofile, and no core files.
func buildUlimits() []*container.Ulimit {
	return []*container.Ulimit{
		{Name: "nofile", Soft: buildNofile, Hard: buildNofile},
		{Name: "core", Soft: 0, Hard: 0},
	}
}

// buildState is the part of Driver that Build's limits keep.
type buildState struct {
	buildOnce sync.Once
	limits    BuildLimits
	cgroups   buildCgroups
}
