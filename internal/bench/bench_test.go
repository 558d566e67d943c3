package bench_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/bench"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// newEnv opens a Manager on a fresh home and registers the removal of everything the run creates.
func newEnv(tb testing.TB) *bench.Env {
	tb.Helper()
	cli := testutil.Docker(tb)
	image := testutil.TestImage(tb)
	m, err := sandkeep.Open(tb.Context(), sandkeep.Config{Home: tb.TempDir(), Image: image, AgentPath: testutil.AgentBinary(tb)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	testutil.Cleanup(tb, m.Installation())
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &bench.Env{M: m, Docker: cli, Image: image, Tenant: "bench-" + hex.EncodeToString(b[:])}
}

// TestScenariosRun keeps every scenario working (tiny sample counts); it asserts results, never timings.
func TestScenariosRun(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	for _, sc := range []struct {
		name string
		run  func() (bench.Result, error)
	}{
		{"warm", func() (bench.Result, error) { return bench.WarmExec(ctx, e, 3) }},
		{"first", func() (bench.Result, error) { return bench.FirstCommand(ctx, e, 2) }},
		{"concurrent", func() (bench.Result, error) { return bench.ConcurrentFirst(ctx, e, 10) }},
		{"parallel", func() (bench.Result, error) { return bench.ParallelKeys(ctx, e, 3, 2) }},
	} {
		t.Run(sc.name, func(t *testing.T) {
			r, err := sc.run()
			if err != nil {
				t.Fatal(err)
			}
			if r.Sandkeep.N == 0 || r.Base.N == 0 || r.Ratio <= 0 {
				t.Fatalf("empty result: %+v", r)
			}
			t.Log(r)
		})
	}
}

func samples(def int) int {
	if n, err := strconv.Atoi(os.Getenv("SANDKEEP_BENCH_N")); err == nil && n > 0 {
		return n
	}
	return def
}

// BenchmarkCore runs each scenario once, side by side with its baseline, and reports medians and ratios.
// Reproduce with: SANDKEEP_REQUIRE_DOCKER=1 go test -run '^$' -bench Core -benchtime 1x ./internal/bench/
func BenchmarkCore(b *testing.B) {
	e := newEnv(b)
	ctx := b.Context()
	scenarios := []struct {
		name string
		run  func() (bench.Result, error)
	}{
		{"WarmExec", func() (bench.Result, error) { return bench.WarmExec(ctx, e, samples(200)) }},
		{"FirstCommand", func() (bench.Result, error) { return bench.FirstCommand(ctx, e, samples(20)) }},
		{"Concurrent100", func() (bench.Result, error) { return bench.ConcurrentFirst(ctx, e, 100) }},
		{"Parallel20Keys", func() (bench.Result, error) { return bench.ParallelKeys(ctx, e, 20, samples(10)) }},
	}
	var rows []string
	for _, sc := range scenarios {
		b.Run(sc.name, func(b *testing.B) {
			for b.Loop() {
				r, err := sc.run()
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(r.Sandkeep.Median)/1e6, "sandkeep-median-ms")
				b.ReportMetric(float64(r.Base.Median)/1e6, "base-median-ms")
				b.ReportMetric(r.Ratio, "ratio")
				rows = append(rows, r.String())
			}
		})
	}
	fmt.Println(bench.Header)
	for _, r := range rows {
		fmt.Println(r)
	}
}
