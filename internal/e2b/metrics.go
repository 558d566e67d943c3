package e2b

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
)

// metricJSON is E2B's SandboxMetric.
type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// cpuSample is what the CPU share of the next sample is measured against.
type cpuSample struct {
	at, since time.Time
	cpu       time.Duration
}

// handleMetrics answers one sample of the sandbox's resource use, read from the engine's stats when it is
// asked for (sandkeep keeps no history): CPU share since the previous call (the first: since the sandbox
// started), memory and the workspace's disk. A paused sandbox, one on a driver that reads no stats, and a window
// (start, end) that excludes now have no samples: an empty list, as E2B answers before its first sample.
func (f *Front) handleMetrics(w http.ResponseWriter, r *http.Request) {
	_, rec, ok := f.ownedBy(w, r, auth.ScopeRead)
	if !ok {
		return
	}
	q := r.URL.Query()
	now := f.now()
	for _, p := range []struct {
		name   string
		before bool
	}{{"start", false}, {"end", true}} {
		v := q.Get(p.name)
		if v == "" {
			continue
		}
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			f.writeError(w, r, badRequest("%s must be a Unix time in seconds, got %q", p.name, v))
			return
		}
		// end is whole seconds: the current second is still inside it.
		if t := time.Unix(secs, 0); (p.before && now.After(t.Add(time.Second))) || (!p.before && now.Before(t)) {
			writeJSON(w, http.StatusOK, []metricJSON{})
			return
		}
	}
	b, _ := f.backend()
	sr, ok := b.(service.StatsReader)
	if rec.Paused || !ok {
		writeJSON(w, http.StatusOK, []metricJSON{})
		return
	}
	key, err := keyOf(rec)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	st, err := sr.Stats(r.Context(), key)
	if fault.Is(err, fault.SpecUnsupported) || fault.Is(err, fault.SandboxNotRunning) {
		writeJSON(w, http.StatusOK, []metricJSON{})
		return
	}
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, []metricJSON{f.metricOf(rec.ID, st)})
}

// metricOf turns a sample into E2B's shape. cpuUsedPct is the share of the sandbox's CPUs it used since the
// previous sample of the same run of the sandbox (else since it started), 0..100.
func (f *Front) metricOf(id string, st sandkeep.Stats) metricJSON {
	f.cpuMu.Lock()
	prev, ok := f.lastCPU[id]
	f.lastCPU[id] = cpuSample{at: st.At, since: st.Since, cpu: st.CPUTime}
	f.cpuMu.Unlock()
	if !ok || !prev.since.Equal(st.Since) || !st.At.After(prev.at) || st.CPUTime < prev.cpu {
		prev = cpuSample{at: st.Since, cpu: 0}
	}
	pct := 0.0
	if wall := st.At.Sub(prev.at); wall > 0 && st.CPUs > 0 && !prev.at.IsZero() {
		pct = math.Min(100, 100*float64(st.CPUTime-prev.cpu)/float64(wall)/st.CPUs)
		pct = math.Round(pct*100) / 100
	}
	return metricJSON{Timestamp: st.At.UTC(), TimestampUnix: st.At.Unix(), CPUCount: max(1, int(math.Ceil(st.CPUs))),
		CPUUsedPct: pct, MemUsed: st.MemoryUsed, MemTotal: st.MemoryLimit, MemCache: st.MemoryCache,
		DiskUsed: st.DiskUsed, DiskTotal: st.DiskTotal}
}

// forgetCPU drops a removed sandbox's previous sample.
func (f *Front) forgetCPU(id string) {
	f.cpuMu.Lock()
	delete(f.lastCPU, id)
	f.cpuMu.Unlock()
}
