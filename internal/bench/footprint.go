package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/client"
)

// Footprint is what K idle sandboxes cost. It has no timing baseline: there is nothing to alternate with, so it
// reports sizes, not ratios. Sizes are in bytes.
type Footprint struct {
	Sandboxes int           `json:"sandboxes"`
	Idle      time.Duration `json:"idle_ns"` // how long they idled before the measurement

	// Agent inside each sandbox: PID 1 (init) plus its serve child (which owns the channel), as the host's
	// /proc sees them. RSS counts the static binary's shared text once per process; PSS shares it out.
	AgentRSSMedian  int64 `json:"agent_rss_median_bytes"`
	AgentRSSMax     int64 `json:"agent_rss_max_bytes"`
	AgentPSSMedian  int64 `json:"agent_pss_median_bytes"`
	AgentProcsMax   int   `json:"agent_processes_max"` // processes found per sandbox (2 when serve is up)
	InitRSSMedian   int64 `json:"init_rss_median_bytes"`
	ServeRSSMedian  int64 `json:"serve_rss_median_bytes"`
	ServeConnected  int   `json:"serve_connected"` // sandboxes whose serve child was found
	HostHeapPerBox  int64 `json:"host_heap_per_sandbox_bytes"`
	HostRSSPerBox   int64 `json:"host_rss_per_sandbox_bytes"`
	HostGoroutines  int   `json:"host_goroutines_per_sandbox"` // rounded; the channel's accept loop etc.
	ShimRSSPerBox   int64 `json:"shim_rss_per_sandbox_bytes"`  // engine overhead, not sandkeep's
	ShimsFound      int   `json:"shims_found"`                 // containerd-shim parents of our sandboxes
	EngineRSSPerBox int64 `json:"engine_daemons_rss_delta_per_sandbox_bytes"`
}

// Result returns f as a Result row without timings (Extra carries the sizes), for JSON and the table.
func (f Footprint) Result() Result {
	mib := func(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 2, 64) }
	kib := func(b int64) string { return strconv.FormatFloat(float64(b)/(1<<10), 'f', 1, 64) }
	return Result{
		Scenario: fmt.Sprintf("idle footprint, %d sandboxes idle %s", f.Sandboxes, f.Idle),
		Baseline: "none (sizes, no timing baseline)",
		Extra: map[string]string{
			"agent_rss_median_mib":                     mib(f.AgentRSSMedian),
			"agent_rss_max_mib":                        mib(f.AgentRSSMax),
			"agent_pss_median_mib":                     mib(f.AgentPSSMedian),
			"init_rss_median_mib":                      mib(f.InitRSSMedian),
			"serve_rss_median_mib":                     mib(f.ServeRSSMedian),
			"serve_connected":                          strconv.Itoa(f.ServeConnected),
			"host_heap_per_sandbox_kib":                kib(f.HostHeapPerBox),
			"host_rss_per_sandbox_kib":                 kib(f.HostRSSPerBox),
			"host_goroutines_per_sandbox":              strconv.Itoa(f.HostGoroutines),
			"engine_shim_rss_per_sandbox_mib":          mib(f.ShimRSSPerBox),
			"engine_daemons_rss_delta_per_sandbox_mib": mib(f.EngineRSSPerBox),
		},
	}
}

// hostMem is this process's memory after a full GC: the Go heap in use plus goroutine stacks, and its RSS.
type hostMem struct {
	heap, rss  int64
	goroutines int
}

func measureHost() (hostMem, error) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, err := procStatusKB("self", "VmRSS")
	return hostMem{heap: int64(ms.HeapAlloc + ms.StackInuse), rss: rss, goroutines: runtime.NumGoroutine()}, err
}

// IdleFootprint creates k sandboxes (first commands over the agent transport, eight at a time), lets them idle
// for idle, and measures: the agent's RSS inside each (its PID 1 as the engine reports it, plus the serve child
// that owns the channel); this process's Go heap (+ stacks) and RSS after a GC, before and after, per sandbox;
// and, labelled as engine overhead, the RSS of each sandbox's containerd-shim and the growth of dockerd and
// containerd. The sandboxes are removed before it returns.
func IdleFootprint(ctx context.Context, e *Env, k int, idle time.Duration) (_ Footprint, err error) {
	users := make([]string, k)
	for i := range users {
		users[i] = "idle-" + strconv.Itoa(i)
	}
	defer func() { err = errors.Join(err, e.removeUsers(ctx, users)) }()

	before, err := measureHost()
	if err != nil {
		return Footprint{}, err
	}
	engineBefore := engineRSS()
	ids := make([]string, k)
	err = forEach(ctx, k, 8, func(ctx context.Context, i int) error {
		res, err := e.skTrue(ctx, users[i])
		if err == nil {
			ids[i] = res.Sandbox.ID
		}
		return err
	})
	if err != nil {
		return Footprint{}, fmt.Errorf("idle footprint setup: %w", err)
	}
	select {
	case <-time.After(idle):
	case <-ctx.Done():
		return Footprint{}, ctx.Err()
	}
	after, err := measureHost()
	if err != nil {
		return Footprint{}, err
	}
	engineAfter := engineRSS()

	f := Footprint{
		Sandboxes:       k,
		Idle:            idle,
		HostHeapPerBox:  (after.heap - before.heap) / int64(k),
		HostRSSPerBox:   (after.rss - before.rss) / int64(k),
		HostGoroutines:  int(float64(after.goroutines-before.goroutines)/float64(k) + 0.5),
		EngineRSSPerBox: (engineAfter - engineBefore) / int64(k),
	}
	var total, pss, inits, serves []int64
	shims := map[int]bool{}
	var shimRSS int64
	for _, id := range ids {
		ins, err := e.Docker.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		if err != nil {
			return Footprint{}, fmt.Errorf("inspect %s: %w", id, err)
		}
		if ins.Container.State == nil || ins.Container.State.Pid <= 0 {
			return Footprint{}, fmt.Errorf("sandbox %s is not running", id)
		}
		pid := ins.Container.State.Pid
		a, err := agentMem(pid)
		if err != nil {
			return Footprint{}, fmt.Errorf("agent of %s: %w", id, err)
		}
		total, pss, inits = append(total, a.rss), append(pss, a.pss), append(inits, a.initRSS)
		if a.procs > 1 {
			f.ServeConnected++
			serves = append(serves, a.rss-a.initRSS)
		}
		f.AgentProcsMax = max(f.AgentProcsMax, a.procs)
		if ppid, err := parentOf(pid); err == nil && !shims[ppid] && strings.HasPrefix(comm(ppid), "containerd-shim") {
			shims[ppid] = true
			if rss, err := procStatusKB(strconv.Itoa(ppid), "VmRSS"); err == nil {
				shimRSS += rss
			}
		}
	}
	f.AgentRSSMedian, f.AgentRSSMax = median(total), slices.Max(total)
	f.AgentPSSMedian, f.InitRSSMedian, f.ServeRSSMedian = median(pss), median(inits), median(serves)
	f.ShimsFound = len(shims)
	if len(shims) > 0 {
		f.ShimRSSPerBox = shimRSS / int64(len(shims))
	}
	return f, nil
}

func median(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// agent is the memory of one sandbox's agent processes.
type agent struct {
	rss, pss, initRSS int64
	procs             int
}

// agentMem reads the RSS (and PSS) of pid and of its children (the agent's serve child; a command would be a
// grandchild and an idle agent has none).
func agentMem(pid int) (agent, error) {
	var a agent
	pids := append([]int{pid}, childrenOf(pid)...)
	for i, p := range pids {
		rss, err := procStatusKB(strconv.Itoa(p), "VmRSS")
		if err != nil {
			if i == 0 {
				return agent{}, err
			}
			continue // the child exited meanwhile
		}
		if i == 0 {
			a.initRSS = rss
		}
		a.rss += rss
		a.procs++
		if pss, err := smapsRollupKB(p, "Pss"); err == nil {
			a.pss += pss
		}
	}
	return a, nil
}

// childrenOf lists pid's children from /proc/<pid>/task/*/children.
func childrenOf(pid int) []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// parentOf reads pid's parent from /proc/<pid>/stat (the field after the parenthesised command name).
func parentOf(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	return strconv.Atoi(f[1])
}

func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// engineRSS sums the RSS of the dockerd and containerd processes (engine daemons, not shims).
func engineRSS() int64 {
	var sum int64
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid := filepath.Base(d)
		if c := comm(atoi(pid)); c == "dockerd" || c == "containerd" {
			if rss, err := procStatusKB(pid, "VmRSS"); err == nil {
				sum += rss
			}
		}
	}
	return sum
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

// procStatusKB reads a "Name:   N kB" field of /proc/<pid>/status, in bytes.
func procStatusKB(pid, field string) (int64, error) {
	return kbField("/proc/"+pid+"/status", field)
}

func smapsRollupKB(pid int, field string) (int64, error) {
	return kbField(fmt.Sprintf("/proc/%d/smaps_rollup", pid), field)
}

func kbField(path, field string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		v := strings.Fields(rest)
		if len(v) == 0 {
			break
		}
		kb, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %s: %w", path, field, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: no %s", path, field)
}
