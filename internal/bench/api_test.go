package bench_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/bench"
)

// TestAPIScenario runs the api scenario small (a real server on loopback, the real backend, Docker) and checks
// what its report promises: both rows filled, every load result checked and none lost, one heap sample at the
// start and after each tenth of the requests, and no sandbox left behind. Timings are not asserted.
func TestAPIScenario(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	const requests = 40
	rs, err := bench.API(ctx, e, bench.APIOptions{N: 4, Requests: requests, Clients: 6, Users: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 4 {
		t.Fatalf("got %d rows, want 4 (side by side, served vs library, served vs raw exec, load): %+v", len(rs), rs)
	}
	side, load := rs[0], rs[3]
	for _, r := range rs[1:3] {
		if r.Extra["store"] != "SQLite" || r.Sandkeep.N != 4 || r.Base.N != 4 {
			t.Errorf("served row: %+v", r)
		}
	}
	for _, r := range rs {
		t.Log(r)
		if r.Sandkeep.Median <= 0 || r.Base.Median <= 0 || r.Ratio <= 0 || r.Extra["transport"] != "agent" {
			t.Errorf("implausible row: %+v", r)
		}
	}
	if side.Sandkeep.N != 4 || side.Base.N != 4 {
		t.Errorf("side by side took %d API and %d library samples, want 4 each", side.Sandkeep.N, side.Base.N)
	}
	if _, err := strconv.ParseFloat(side.Extra["added_median_ms"], 64); err != nil {
		t.Errorf("no added latency: %v", side.Extra)
	}
	if load.Sandkeep.N != requests || load.Base.N != requests {
		t.Errorf("load timed %d API and %d library requests, want %d each", load.Sandkeep.N, load.Base.N, requests)
	}
	want := map[string]string{"errors": "0", "lost_results": "0", "results_checked": "40+40"}
	for k, v := range want {
		if load.Extra[k] != v {
			t.Errorf("load %s = %q, want %q", k, load.Extra[k], v)
		}
	}
	if n := len(strings.Split(load.Extra["heap_inuse_samples_mib"], ",")); n != 11 {
		t.Errorf("%d heap samples, want 11 (start and each tenth): %v", n, load.Extra)
	}
	for _, k := range []string{"api_execs_per_s", "lib_execs_per_s", "heap_growth_per_1k_kib", "heap_inuse_peak_mib"} {
		if _, err := strconv.ParseFloat(load.Extra[k], 64); err != nil {
			t.Errorf("load %s = %q is not a number", k, load.Extra[k])
		}
	}
	if n := countContainers(t, e, "io.sandkeep.installation="+e.M.Installation()); n != 0 {
		t.Errorf("%d sandboxes left behind", n)
	}
}
