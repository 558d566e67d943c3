package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"

	"github.com/sandkeep/sandkeep/internal/driver"
)

// Scenario names, in the order Run runs them.
const (
	ScenarioWarm       = "warm"
	ScenarioOutput     = "output"
	ScenarioFirst      = "first"
	ScenarioConcurrent = "concurrent"
	ScenarioThroughput = "throughput"
	ScenarioFootprint  = "footprint"
	ScenarioAdmission  = "admission"
	ScenarioAPI        = "api"
	ScenarioTunnel     = "tunnel"
	ScenarioHardening  = "hardening"
)

// Scenarios lists every scenario a run without a choice runs, in run order.
var Scenarios = []string{ScenarioWarm, ScenarioOutput, ScenarioFirst, ScenarioConcurrent, ScenarioThroughput, ScenarioFootprint, ScenarioAPI, ScenarioAdmission, ScenarioTunnel, ScenarioHardening, ScenarioConnect, ScenarioPool, ScenarioFleet}

// OptIn lists the scenarios that run only when named (they need tools besides Docker: node and the e2b SDK).
var OptIn = []string{ScenarioE2B}

// Defaults of Options' zero fields.
const (
	DefaultWarmN       = 200 // warm exec samples per series
	DefaultOutputN     = 50  // 1 MiB output samples per series
	DefaultFirstN      = 20  // first-command samples per series
	DefaultConcurrent  = 100 // concurrent first calls for one key
	DefaultThroughputN = 20  // commands per key in the throughput scenario
	DefaultKeys        = 50  // keys in the throughput scenario
	DefaultFootprint   = 100 // idle sandboxes in the footprint scenario
	DefaultIdle        = 2 * time.Second
)

// Options chooses the scenarios and their sizes. N, when set, is the sample count of every timed scenario
// (and the commands per key of throughput); zero keeps each scenario's default.
type Options struct {
	Scenarios []string // names from Scenarios; empty means all
	N         int
	Keys      int
	Footprint int
	Idle      time.Duration
	Requests  int    // requests of the api scenario's sustained load; zero: DefaultAPIRequests
	Postgres  string // a PostgreSQL DSN the api scenario's served rows also record into; empty: SQLite only
	E2BSDK    string // the e2b scenario's directory of the SDK (npm ci) and bench.mjs; empty: DefaultE2BSDK
}

// Machine describes where a run happened.
type Machine struct {
	Cores         int       `json:"cores"`
	MemoryBytes   int64     `json:"memory_bytes"`
	Kernel        string    `json:"kernel"`
	OS            string    `json:"os"`
	Arch          string    `json:"arch"`
	GoVersion     string    `json:"go_version"`
	DockerVersion string    `json:"docker_version"`
	DockerAPI     string    `json:"docker_api_version"`
	LoadStart     string    `json:"load_start"` // /proc/loadavg's 1, 5 and 15 minute averages when the run began
	LoadEnd       string    `json:"load_end"`
	Started       time.Time `json:"started"`
	Duration      string    `json:"duration"`
}

// Report is one run: the machine, one row per timed comparison, and the idle footprint when it ran.
type Report struct {
	Machine      Machine    `json:"machine"`
	Image        string     `json:"image"`
	Installation string     `json:"installation"` // label io.sandkeep.installation of every sandbox the run made
	Tenant       string     `json:"tenant"`       // label io.sandkeep.bench of every raw container the run made
	Results      []Result   `json:"results"`
	Footprint    *Footprint `json:"footprint,omitempty"`
}

// Describe fills what is known about the machine before the run.
func Describe(ctx context.Context, docker *client.Client) Machine {
	m := Machine{Cores: runtime.NumCPU(), OS: runtime.GOOS, Arch: runtime.GOARCH, GoVersion: runtime.Version(),
		LoadStart: loadavg(), Started: time.Now().UTC()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	m.MemoryBytes, _ = kbField("/proc/meminfo", "MemTotal")
	if v, err := docker.ServerVersion(ctx, client.ServerVersionOptions{}); err == nil {
		m.DockerVersion, m.DockerAPI = v.Version, v.APIVersion
	}
	return m
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// CheckScenarios rejects an unknown scenario name.
func CheckScenarios(names []string) error {
	for _, n := range names {
		all := append(slices.Clone(Scenarios), OptIn...)
		if !slices.Contains(all, n) {
			return fmt.Errorf("unknown scenario %q (known: %s)", n, strings.Join(all, ", "))
		}
	}
	return nil
}

// Run runs the chosen scenarios in a fixed order and returns the report; progress, when not nil, gets one line
// per scenario. Each scenario removes the sandboxes it created; Cleanup removes whatever an interrupted run left.
func Run(ctx context.Context, e *Env, o Options, progress io.Writer) (Report, error) {
	if err := CheckScenarios(o.Scenarios); err != nil {
		return Report{}, err
	}
	want := func(name string) bool {
		if len(o.Scenarios) == 0 {
			return !slices.Contains(OptIn, name)
		}
		for _, s := range o.Scenarios {
			if s == name {
				return true
			}
		}
		return false
	}
	n := func(def int) int {
		if o.N > 0 {
			return o.N
		}
		return def
	}
	orDefault := func(v, def int) int {
		if v > 0 {
			return v
		}
		return def
	}
	idle := o.Idle
	if idle <= 0 {
		idle = DefaultIdle
	}
	rep := Report{Machine: Describe(ctx, e.Docker), Image: e.Image, Installation: e.M.Installation(), Tenant: e.Tenant}
	one := func(r Result, err error) ([]Result, error) { return []Result{r}, err }
	steps := []struct {
		name string
		run  func() ([]Result, error)
	}{
		{ScenarioWarm, func() ([]Result, error) { return WarmExec(ctx, e, n(DefaultWarmN)) }},
		{ScenarioOutput, func() ([]Result, error) { return one(WarmOutput(ctx, e, n(DefaultOutputN))) }},
		{ScenarioFirst, func() ([]Result, error) { return one(FirstCommand(ctx, e, n(DefaultFirstN))) }},
		{ScenarioConcurrent, func() ([]Result, error) { return one(ConcurrentFirst(ctx, e, DefaultConcurrent)) }},
		{ScenarioThroughput, func() ([]Result, error) {
			return one(Throughput(ctx, e, orDefault(o.Keys, DefaultKeys), n(DefaultThroughputN)))
		}},
		{ScenarioFootprint, func() ([]Result, error) {
			f, err := IdleFootprint(ctx, e, orDefault(o.Footprint, DefaultFootprint), idle)
			if err != nil {
				return nil, err
			}
			rep.Footprint = &f
			return []Result{f.Result()}, nil
		}},
		{ScenarioAdmission, func() ([]Result, error) { return Admission(ctx, e, n(DefaultAdmissionN)) }},
		{ScenarioAPI, func() ([]Result, error) {
			return API(ctx, e, APIOptions{N: n(DefaultAPIN), Requests: orDefault(o.Requests, DefaultAPIRequests), Postgres: o.Postgres})
		}},
		{ScenarioTunnel, func() ([]Result, error) { return Tunnel(ctx, n(DefaultTunnelN)) }},
		{ScenarioHardening, func() ([]Result, error) {
			return Hardening(ctx, e, n(DefaultHardeningWarmN), n(DefaultHardeningFirstN))
		}},
		{ScenarioConnect, func() ([]Result, error) { return Connect(ctx, e, n(DefaultConnectN), n(DefaultConnectExecN)) }},
		{ScenarioPool, func() ([]Result, error) { return Pool(ctx, e, n(DefaultPoolN), orDefault(o.Keys, DefaultPoolBurst)) }},
		{ScenarioFleet, func() ([]Result, error) { return Fleet(ctx, e, n(DefaultFleetN), DefaultLeaseKeys, o.Postgres) }},
		{ScenarioE2B, func() ([]Result, error) { return E2B(ctx, e, n(DefaultE2BN), n(DefaultE2BCreateN), o.E2BSDK) }},
	}
	begin := time.Now()
	for _, s := range steps {
		if !want(s.name) {
			continue
		}
		start := time.Now()
		rs, err := s.run()
		if err != nil {
			return rep, fmt.Errorf("scenario %s: %w", s.name, err)
		}
		rep.Results = append(rep.Results, rs...)
		if progress != nil {
			fmt.Fprintf(progress, "bench: %s done in %s (load %s)\n", s.name, time.Since(start).Round(time.Millisecond), loadavg())
		}
	}
	rep.Machine.LoadEnd = loadavg()
	rep.Machine.Duration = time.Since(begin).Round(time.Millisecond).String()
	return rep, nil
}

// Cleanup force-removes every container of installation (the sandboxes of the run's state home) and every raw
// baseline container labelled io.sandkeep.bench=tenant. Call it with a context that outlives an interruption.
func Cleanup(ctx context.Context, docker *client.Client, installation, tenant string) error {
	if installation == "" || tenant == "" {
		return errors.New("bench cleanup: empty installation or tenant would match too much")
	}
	var errs []error
	for _, label := range []string{driver.LabelInstallation + "=" + installation, LabelRaw + "=" + tenant} {
		list, err := docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: client.Filters{}.Add("label", label)})
		if err != nil {
			errs = append(errs, fmt.Errorf("list containers %s: %w", label, err))
			continue
		}
		for _, c := range list.Items {
			_, err := docker.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
			if err != nil && !cerrdefs.IsNotFound(err) && !cerrdefs.IsConflict(err) {
				errs = append(errs, fmt.Errorf("remove container %s: %w", c.ID, err))
			}
		}
	}
	return errors.Join(errs...)
}

// WriteMarkdown writes the report as Markdown: the machine, the table of timed rows and the footprint lines.
func WriteMarkdown(w io.Writer, r Report) error {
	m := r.Machine
	var b strings.Builder
	fmt.Fprintf(&b, "machine: %d cores, %.1f GiB, kernel %s, Docker %s (API %s), %s; load %s -> %s; %s\n\n",
		m.Cores, float64(m.MemoryBytes)/(1<<30), m.Kernel, m.DockerVersion, m.DockerAPI, m.GoVersion,
		m.LoadStart, m.LoadEnd, m.Duration)
	b.WriteString(Header + "\n")
	for _, res := range r.Results {
		if res.Sandkeep.N == 0 && res.Base.N == 0 {
			continue // the footprint, below
		}
		b.WriteString(res.String() + "\n")
	}
	if f := r.Footprint; f != nil {
		mib := func(v int64) string { return fmt.Sprintf("%.2f MiB", float64(v)/(1<<20)) }
		kib := func(v int64) string { return fmt.Sprintf("%.1f KiB", float64(v)/(1<<10)) }
		fmt.Fprintf(&b, "\nidle footprint, %d sandboxes idle %s (sizes; no timing baseline):\n", f.Sandboxes, f.Idle)
		fmt.Fprintf(&b, "- agent RSS per sandbox (init + serve): median %s, max %s (PSS median %s; init %s, serve %s; serve connected in %d/%d)\n",
			mib(f.AgentRSSMedian), mib(f.AgentRSSMax), mib(f.AgentPSSMedian), mib(f.InitRSSMedian), mib(f.ServeRSSMedian),
			f.ServeConnected, f.Sandboxes)
		fmt.Fprintf(&b, "- host memory per idle sandbox, this process after GC: Go heap + stacks %s, RSS %s, goroutines %d\n",
			kib(f.HostHeapPerBox), kib(f.HostRSSPerBox), f.HostGoroutines)
		fmt.Fprintf(&b, "- engine overhead (not sandkeep's): containerd-shim RSS per sandbox %s (%d shims), dockerd+containerd RSS growth per sandbox %s\n",
			mib(f.ShimRSSPerBox), f.ShimsFound, mib(f.EngineRSSPerBox))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
