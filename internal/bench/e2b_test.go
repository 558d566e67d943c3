package bench_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/bench"
	"github.com/sandkeep/sandkeep/internal/driver"
)

// TestE2BScenario runs the e2b scenario small: the real e2b npm SDK (test/e2b-ts, installed by scripts/test.sh)
// in node against the E2B front over the real backend and Docker. It checks the rows it promises, filled with
// the samples asked for, and that the SDK's sandboxes are gone after it; timings are not asserted.
func TestE2BScenario(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	rs, err := bench.E2B(ctx, e, 4, 2, filepath.Join("..", "..", "test", "e2b-ts"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 {
		t.Fatalf("got %d rows, want 3 (warm vs Engine-API exec, warm vs docker exec, create vs docker run): %+v", len(rs), rs)
	}
	for i, r := range rs {
		t.Log(r)
		want := 4
		if i == 2 {
			want = 2
		}
		if r.Sandkeep.N != want || r.Base.N != want || r.Sandkeep.Median <= 0 || r.Base.Median <= 0 || !strings.Contains(r.Extra["client"], "e2b npm SDK 2.") {
			t.Errorf("row %d: %+v", i, r)
		}
	}
	if !strings.Contains(rs[2].Baseline, "docker run --rm") {
		t.Errorf("the create row's baseline is %q", rs[2].Baseline)
	}
	if n := countContainers(t, e, driver.LabelInstallation+"="+e.M.Installation()); n != 0 {
		t.Errorf("%d sandboxes left behind by the SDK", n)
	}
}
