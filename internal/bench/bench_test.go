package bench_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/drivers"
	"github.com/sandkeep/sandkeep/internal/bench"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// newEnv opens two Managers (agent and exec transports) on one fresh home and registers the removal of
// everything the run creates.
func newEnv(tb testing.TB) *bench.Env {
	tb.Helper()
	cli := testutil.Docker(tb)
	image := testutil.TestImage(tb)
	home, agent := tb.TempDir(), testutil.AgentBinary(tb)
	open := func(transport string) *sandkeep.Manager {
		m, err := sandkeep.Open(tb.Context(), sandkeep.Config{Home: home, Image: image, AgentPath: agent, Transport: transport,
			Drivers: []sandkeep.DriverOption{drivers.Docker()}, NoSweeper: true})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { m.Close() })
		return m
	}
	m, mexec := open("agent"), open("exec")
	testutil.Cleanup(tb, m.Installation())
	var b [4]byte
	_, _ = rand.Read(b[:])
	e := &bench.Env{M: m, MExec: mexec, Docker: cli, Image: image, Tenant: "bench-" + hex.EncodeToString(b[:]),
		Config: sandkeep.Config{Home: home, Image: image, AgentPath: agent, Drivers: []sandkeep.DriverOption{drivers.Docker()}, NoSweeper: true}}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := bench.Cleanup(ctx, cli, m.Installation(), e.Tenant); err != nil {
			tb.Error(err)
		}
	})
	return e
}

// TestScenariosRun keeps every scenario working (tiny sample counts); it asserts results, never timings.
func TestScenariosRun(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	rows := func(r bench.Result, err error) ([]bench.Result, error) { return []bench.Result{r}, err }
	for _, sc := range []struct {
		name      string
		run       func() ([]bench.Result, error)
		rows      int
		transport []string // Extra["transport"] of each row
	}{
		{"warm", func() ([]bench.Result, error) { return bench.WarmExec(ctx, e, 3) }, 2, []string{"agent", "exec"}},
		{"output", func() ([]bench.Result, error) { return rows(bench.WarmOutput(ctx, e, 2)) }, 1, []string{"agent"}},
		{"first", func() ([]bench.Result, error) { return rows(bench.FirstCommand(ctx, e, 2)) }, 1, []string{"agent"}},
		{"concurrent", func() ([]bench.Result, error) { return rows(bench.ConcurrentFirst(ctx, e, 10)) }, 1, nil},
		{"throughput", func() ([]bench.Result, error) { return rows(bench.Throughput(ctx, e, 3, 2)) }, 1, []string{"agent"}},
		{"admission", func() ([]bench.Result, error) { return bench.Admission(ctx, e, 3) }, 2, nil},
		{"hardening", func() ([]bench.Result, error) { return bench.Hardening(ctx, e, 3, 2) }, 2, []string{"agent", "agent"}},
		{"connect", func() ([]bench.Result, error) { return bench.Connect(ctx, e, 3, 3) }, 4, []string{"", "", "", "agent"}},
		{"fleet", func() ([]bench.Result, error) { return bench.Fleet(ctx, e, 3, 50, "") }, 2, []string{"agent", ""}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			rs, err := sc.run()
			if err != nil {
				t.Fatal(err)
			}
			if len(rs) != sc.rows {
				t.Fatalf("got %d rows, want %d: %+v", len(rs), sc.rows, rs)
			}
			for i, r := range rs {
				if r.Sandkeep.N == 0 || r.Base.N == 0 || r.Ratio <= 0 {
					t.Fatalf("empty result: %+v", r)
				}
				if sc.transport != nil && r.Extra["transport"] != sc.transport[i] {
					t.Fatalf("row %d measured transport %q, want %q", i, r.Extra["transport"], sc.transport[i])
				}
				t.Log(r)
			}
			if sc.name == "concurrent" {
				r := rs[0]
				if r.Extra["containers_created_per_key"] != "1" || r.Extra["containers_per_key"] != "1" {
					t.Fatalf("concurrent first calls made more than one container per key: %v", r.Extra)
				}
			}
			if sc.name == "admission" && (rs[0].Extra["added_median_ms"] == "" || rs[1].Extra["added_median_ms"] == "") {
				t.Fatalf("no added latency in %v, %v", rs[0].Extra, rs[1].Extra)
			}
			if sc.name == "hardening" && (rs[0].Extra["target"] != "1.15x" || rs[1].Extra["target"] != "1.05x" || rs[0].Extra["quota"] != "1GiB") {
				t.Fatalf("hardening rows lack their targets or the quota: %v, %v", rs[0].Extra, rs[1].Extra)
			}
			if sc.name == "connect" && (rs[0].Extra["added_ms_per_CONNECT"] == "" || rs[3].Extra["added_ms_per_exec"] == "" || rs[3].Extra["meets"] == "") {
				t.Fatalf("connect rows lack the added cost: %v, %v", rs[0].Extra, rs[3].Extra)
			}
			if sc.name == "throughput" && rs[0].Extra["sandkeep_execs_per_s"] == "" {
				t.Fatalf("no throughput in %v", rs[0].Extra)
			}
		})
	}
	t.Run("footprint", func(t *testing.T) {
		f, err := bench.IdleFootprint(ctx, e, 3, 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if f.Sandboxes != 3 || f.AgentRSSMedian <= 0 || f.AgentRSSMax < f.AgentRSSMedian || f.InitRSSMedian <= 0 {
			t.Fatalf("implausible footprint: %+v", f)
		}
		if f.ServeConnected != 3 || f.AgentProcsMax != 2 {
			t.Fatalf("idle agents should be connected (init + serve): %+v", f)
		}
		if f.ShimsFound != 3 || f.ShimRSSPerBox <= 0 {
			t.Fatalf("no containerd-shim found for the sandboxes: %+v", f)
		}
		t.Log(f.Result())
	})
	// Every scenario removes what it made.
	for _, label := range []string{"io.sandkeep.installation=" + e.M.Installation(), bench.LabelRaw + "=" + e.Tenant} {
		if n := countContainers(t, e, label); n != 0 {
			t.Errorf("%d containers labelled %s left behind", n, label)
		}
	}
}

// countContainers counts, straight from the engine, the containers (running or not) carrying label.
func countContainers(t *testing.T, e *bench.Env, label string) int {
	t.Helper()
	// Not t.Context(): a failed test may have cancelled it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := e.Docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: client.Filters{}.Add("label", label)})
	if err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

// TestRunReport runs the suite driver with two scenarios and checks the report's shape and its Markdown.
func TestRunReport(t *testing.T) {
	e := newEnv(t)
	var progress bytes.Buffer
	rep, err := bench.Run(t.Context(), e, bench.Options{Scenarios: []string{bench.ScenarioWarm, bench.ScenarioFootprint}, N: 2, Footprint: 2, Idle: 100 * time.Millisecond}, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 3 || rep.Footprint == nil || rep.Machine.Cores == 0 || rep.Machine.DockerVersion == "" {
		t.Fatalf("report: %+v", rep)
	}
	var md bytes.Buffer
	if err := bench.WriteMarkdown(&md, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{bench.Header, "warm exec `true` (agent transport)", "idle footprint, 2 sandboxes", "containerd-shim"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	if _, err := bench.Run(t.Context(), e, bench.Options{Scenarios: []string{"nope"}}, nil); err == nil {
		t.Error("unknown scenario accepted")
	}
}

func samples(def int) int {
	if n, err := strconv.Atoi(os.Getenv("SANDKEEP_BENCH_N")); err == nil && n > 0 {
		return n
	}
	return def
}

// BenchmarkCore runs the whole suite once and prints the Markdown report (timings are reported, never asserted).
// Reproduce with: SANDKEEP_REQUIRE_DOCKER=1 go test -run '^$' -bench Core -benchtime 1x ./internal/bench/
// (`sandkeep bench` is the same suite from the CLI.)
func BenchmarkCore(b *testing.B) {
	e := newEnv(b)
	for b.Loop() {
		rep, err := bench.Run(b.Context(), e, bench.Options{N: samples(0)}, os.Stderr)
		if err != nil {
			b.Fatal(err)
		}
		for i, r := range rep.Results {
			if r.Sandkeep.N > 0 {
				b.ReportMetric(float64(r.Sandkeep.Median)/1e6, "sandkeep-median-ms/row"+strconv.Itoa(i))
			}
		}
		if err := bench.WriteMarkdown(os.Stdout, rep); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConnectScenario is `sandkeep bench --scenario connect` as a Go benchmark (SANDKEEP_BENCH_N sets the
// blocks and the exec samples per side), printing the Markdown report:
//
//	SANDKEEP_REQUIRE_DOCKER=1 go test -run '^$' -bench ConnectScenario -benchtime 1x ./internal/bench/
func BenchmarkConnectScenario(b *testing.B) {
	e := newEnv(b)
	for b.Loop() {
		rep, err := bench.Run(b.Context(), e, bench.Options{Scenarios: []string{bench.ScenarioConnect}, N: samples(0)}, os.Stderr)
		if err != nil {
			b.Fatal(err)
		}
		if err := bench.WriteMarkdown(os.Stdout, rep); err != nil {
			b.Fatal(err)
		}
	}
}
