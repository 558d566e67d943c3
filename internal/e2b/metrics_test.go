package e2b

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// statsBackend is a fakeBackend whose sandboxes report the stats it is given.
type statsBackend struct {
	*fakeBackend
	mu  sync.Mutex
	st  sandkeep.Stats
	err error
}

func (b *statsBackend) Stats(context.Context, sandkeep.Key) (sandkeep.Stats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.st, b.err
}

func (b *statsBackend) set(st sandkeep.Stats, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.st, b.err = st, err
}

// TestMetrics: getMetrics answers one sample of the engine's stats in E2B's SandboxMetric shape; its CPU share is
// measured since the previous sample (the first: since the sandbox started), against the sandbox's CPUs; a window
// that excludes now, a stopped sandbox and a driver without stats have no samples; another tenant's is not found.
func TestMetrics(t *testing.T) {
	now := time.Unix(1_800_000_000, 0).UTC()
	b := &statsBackend{fakeBackend: &fakeBackend{}}
	f, err := New(Config{Dir: t.TempDir(), MaxTimeout: time.Hour, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, f: f, srv: httptest.NewServer(f.Handler(b, fakeHooks()))}
	t.Cleanup(h.srv.Close)
	t.Cleanup(func() { f.Close() })
	st, body := h.do("POST", "/v2/sandboxes", "key-acme", `{}`)
	if st != 201 {
		t.Fatalf("create: %d %v", st, body)
	}
	id := body["sandboxID"].(string)
	metrics := func(key, query string) (int, []metricJSON) {
		t.Helper()
		req, _ := http.NewRequest("GET", h.srv.URL+"/e2b/sandboxes/"+id+"/metrics"+query, nil)
		req.Header.Set("X-API-KEY", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out []metricJSON
		if resp.StatusCode == 200 {
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode, out
	}

	started := now.Add(-10 * time.Second)
	b.set(sandkeep.Stats{At: now, Since: started, CPUTime: 5 * time.Second, CPUs: 2, MemoryUsed: 64 << 20,
		MemoryLimit: 512 << 20, MemoryCache: 8 << 20, DiskUsed: 1 << 30, DiskTotal: 10 << 30}, nil)
	code, ms := metrics("key-acme", "")
	want := metricJSON{Timestamp: now, TimestampUnix: now.Unix(), CPUCount: 2, CPUUsedPct: 25, MemUsed: 64 << 20,
		MemTotal: 512 << 20, MemCache: 8 << 20, DiskUsed: 1 << 30, DiskTotal: 10 << 30}
	if code != 200 || len(ms) != 1 || ms[0] != want {
		t.Fatalf("first sample: %d %+v, want %+v (5 s of CPU over 10 s on 2 CPUs)", code, ms, want)
	}
	// Ten seconds later, ten more seconds of CPU: half of 2 CPUs since the previous sample.
	now = now.Add(10 * time.Second)
	b.set(sandkeep.Stats{At: now, Since: started, CPUTime: 15 * time.Second, CPUs: 1.5}, nil)
	if _, ms := metrics("key-acme", ""); len(ms) != 1 || ms[0].CPUUsedPct != 66.67 || ms[0].CPUCount != 2 {
		t.Fatalf("second sample: %+v, want 66.67%% of 1.5 CPUs (counted as 2)", ms)
	}
	// The sandbox restarted (a new Since): measured from its start again, never negative.
	b.set(sandkeep.Stats{At: now.Add(time.Second), Since: now.Add(-time.Second), CPUTime: time.Second, CPUs: 1}, nil)
	if _, ms := metrics("key-acme", ""); len(ms) != 1 || ms[0].CPUUsedPct != 50 {
		t.Fatalf("after a restart: %+v, want 50%%", ms)
	}
	for _, q := range []string{"?end=" + strconv.FormatInt(now.Add(-time.Hour).Unix(), 10), "?start=" + strconv.FormatInt(now.Add(time.Hour).Unix(), 10)} {
		if code, ms := metrics("key-acme", q); code != 200 || len(ms) != 0 {
			t.Errorf("metrics%s: %d %+v, want no samples", q, code, ms)
		}
	}
	if code, _ := metrics("key-acme", "?start=yesterday"); code != 400 {
		t.Errorf("a malformed start: %d, want 400", code)
	}
	b.set(sandkeep.Stats{}, fault.New(fault.SandboxNotRunning, "", "not running"))
	if code, ms := metrics("key-acme", ""); code != 200 || len(ms) != 0 {
		t.Errorf("a stopped sandbox: %d %+v, want no samples", code, ms)
	}
	if code, _ := metrics("key-globex", ""); code != 404 {
		t.Errorf("another tenant's metrics: %d, want 404", code)
	}
}
