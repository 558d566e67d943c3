package ui

import (
	"encoding/json"
	"html/template"
	"math"
	"net/http"
	"slices"
	"sort"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
)

// windows a page may look back over, by the name its URL uses.
var windows = []struct {
	Name string
	D    time.Duration
}{{"1h", time.Hour}, {"24h", 24 * time.Hour}, {"7d", 7 * 24 * time.Hour}, {"30d", 30 * 24 * time.Hour}}

func windowOf(r *http.Request) (string, time.Duration) {
	name := r.URL.Query().Get("window")
	for _, w := range windows {
		if w.Name == name {
			return w.Name, w.D
		}
	}
	return "24h", 24 * time.Hour
}

func windowNames() []string {
	out := make([]string, len(windows))
	for i, w := range windows {
		out[i] = w.Name
	}
	return out
}

// --- egress ---

type egressData struct {
	Window  string
	Windows []string
	Hosts   []store.RefusedHost
	Total   int
	Chart   template.HTML
	Recent  []refusal
	Capped  bool // only the newest egressEvents refusals were counted
	Bound   int
}

// egressEvents bounds the refusals the egress page and the overview count: the newest ones of the window.
const egressEvents = 5_000

func (u *UI) handleEgress(w http.ResponseWriter, r *http.Request, v *viewer) {
	name, d := windowOf(r)
	ctx, cancel := pageCtx(r)
	defer cancel()
	hosts, err := u.cfg.Store.RefusedHosts(ctx, store.EventQuery{Tenant: v.scope(), Since: u.now().Add(-d), Limit: 200, Newest: egressEvents})
	if err != nil {
		u.failErr(w, r, v, "the refused hosts", err)
		return
	}
	data := egressData{Window: name, Windows: windowNames(), Hosts: hosts, Bound: egressEvents}
	var bars []bar
	for i, h := range hosts {
		data.Total += h.Count
		if i < 10 {
			bars = append(bars, bar{Label: h.Host + " · " + orDash(h.Reason), Value: float64(h.Count)})
		}
	}
	data.Capped = data.Total >= egressEvents
	data.Chart = barChart("Refused requests by host and reason", bars, func(v float64) string { return formatCount(v) })
	if data.Recent, err = u.refusals(ctx, v, 20); err != nil {
		u.failErr(w, r, v, "the refusals", err)
		return
	}
	u.render(w, r, v, http.StatusOK, "egress", data)
}

// --- latency ---

type latencyData struct {
	Window        string
	Windows       []string
	Warm          template.HTML
	Gate          template.HTML
	First         template.HTML
	WarmN, FirstN int
	Runs          int  // runs read
	Capped        bool // the window may have more runs than were read
	Bound         int
	Server        template.HTML
	ServerShown   bool
}

// latencyRuns bounds the runs the latency page reads the events of: the newest ones of the window.
const latencyRuns = 500

// handleLatency draws warm exec time, gate wait and first-command time over the window from the recorded events
// (the viewer's tenant's, or every tenant's for the operator), and, for the operator, the server's own histograms.
//
// A command is warm when its sandbox was already running: no sandbox_started, _recycled or _adopted event came
// between the previous command of its run and it. A first command is one that had to wait for its sandbox to be
// created or started; its time is that wait plus its own run time.
func (u *UI) handleLatency(w http.ResponseWriter, r *http.Request, v *viewer) {
	name, d := windowOf(r)
	now := u.now()
	since := now.Add(-d)
	ctx, cancel := pageCtx(r)
	defer cancel()
	// The newest runs first (an index walk), then their command events: bounded work whatever the window holds.
	page, err := u.cfg.Store.QueryRuns(ctx, store.RunQuery{Tenant: v.scope(), Limit: latencyRuns})
	if err != nil {
		u.failErr(w, r, v, "the runs", err)
		return
	}
	var ids []string
	for _, run := range page.Runs {
		if !run.FinishedAt.IsZero() && run.FinishedAt.Before(since) {
			continue
		}
		ids = append(ids, run.ID)
	}
	var evs []store.RunEvent
	if len(ids) > 0 {
		evs, err = u.cfg.Store.RecentEvents(ctx, store.EventQuery{Tenant: v.scope(), RunIDs: ids, Since: since, Limit: store.MaxEventLimit,
			Names: []string{events.NameSandboxStarted, events.NameSandboxRecycled, events.NameSandboxAdopted, events.NameExecStarted, events.NameExecFinished}})
		if err != nil {
			u.failErr(w, r, v, "the latency events", err)
			return
		}
	}
	data := latencyData{Window: name, Windows: windowNames(), Runs: len(ids), Capped: page.More && len(ids) == len(page.Runs), Bound: latencyRuns}
	created := make(map[string]time.Time, len(page.Runs))
	for _, run := range page.Runs {
		created[run.ID] = run.CreatedAt
	}
	s := latencySamples(evs, created)
	data.WarmN, data.FirstN = len(s.warm), len(s.first)
	const buckets = 24
	data.Warm = lineChart("Warm command time (ms)", quantileSeries(s.warm, since, now, buckets), since, now)
	data.Gate = lineChart("Gate wait (ms)", quantileSeries(s.gate, since, now, buckets), since, now)
	data.First = lineChart("First-command time (ms): sandbox start plus the command", quantileSeries(s.first, since, now, buckets), since, now)
	if v.operator && u.cfg.Gatherer != nil {
		data.Server, data.ServerShown = u.serverHistograms(), true
	}
	u.render(w, r, v, http.StatusOK, "latency", data)
}

type sample struct {
	at time.Time
	ms float64
}

type samples struct{ warm, gate, first []sample }

// latencySamples walks each run's events in order (evs is newest first). A first command that is its run's
// first is timed from the run's creation (created, when known) to its end: admission, the sandbox's start and
// the command, as its caller waited; another is timed as the start's duration_ms plus its own.
func latencySamples(evs []store.RunEvent, created map[string]time.Time) samples {
	var s samples
	type state struct {
		coldMS  int64 // the start's duration since the last command, -1: none (warm)
		started bool
		execs   int // commands finished in this run so far
	}
	runs := map[string]*state{}
	for i := len(evs) - 1; i >= 0; i-- {
		e := evs[i]
		if e.RunID == "" {
			continue
		}
		st := runs[e.RunID]
		if st == nil {
			st = &state{coldMS: -1}
			runs[e.RunID] = st
		}
		switch e.Name {
		case events.NameSandboxStarted:
			var p events.SandboxStarted
			_ = json.Unmarshal(e.Payload, &p)
			st.coldMS = max(st.coldMS, 0) + p.DurationMS
		case events.NameSandboxRecycled, events.NameSandboxAdopted:
			st.coldMS = max(st.coldMS, 0)
		case events.NameExecStarted:
			var p events.ExecStarted
			_ = json.Unmarshal(e.Payload, &p)
			s.gate = append(s.gate, sample{e.Time, float64(p.GateWaitMS)})
			st.started = true
		case events.NameExecFinished:
			var p events.ExecFinished
			_ = json.Unmarshal(e.Payload, &p)
			if !st.started { // its start is older than the window
				st.coldMS = -1
				continue
			}
			if st.coldMS >= 0 {
				ms := float64(st.coldMS + p.DurationMS)
				if at, ok := created[e.RunID]; ok && st.execs == 0 {
					ms = max(ms, float64(e.Time.Sub(at).Milliseconds()))
				}
				s.first = append(s.first, sample{e.Time, ms})
			} else {
				s.warm = append(s.warm, sample{e.Time, float64(p.DurationMS)})
			}
			st.coldMS, st.started = -1, false
			st.execs++
		}
	}
	return s
}

// series is one line of a chart: a value per bucket, NaN where the bucket has no sample.
type series struct {
	Name   string
	Values []float64
}

// quantileSeries returns p50, p90 and p99 (nearest rank) of the samples in each of n equal buckets of [from, to).
func quantileSeries(ss []sample, from, to time.Time, n int) []series {
	width := to.Sub(from) / time.Duration(n)
	byBucket := make([][]float64, n)
	for _, s := range ss {
		i := int(s.at.Sub(from) / width)
		if i < 0 || i >= n {
			if i == n { // the very end of the window
				i = n - 1
			} else {
				continue
			}
		}
		byBucket[i] = append(byBucket[i], s.ms)
	}
	out := []series{{Name: "p50"}, {Name: "p90"}, {Name: "p99"}}
	for _, vals := range byBucket {
		sort.Float64s(vals)
		for k, q := range []float64{.5, .9, .99} {
			out[k].Values = append(out[k].Values, nearestRank(vals, q))
		}
	}
	return out
}

func nearestRank(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// serverHistograms draws p50/p90/p99 since the server started from its own Prometheus histograms: commands that
// exited 0 (sandkeep_exec_duration_seconds{outcome="ok"}) and the gate wait (sandkeep_gate_wait_seconds).
func (u *UI) serverHistograms() template.HTML {
	mfs, err := u.cfg.Gatherer.Gather()
	if err != nil {
		u.log.Warn("ui: gather metrics", "err", err)
	}
	var bars []bar
	for _, mf := range mfs {
		var label string
		switch mf.GetName() {
		case "sandkeep_exec_duration_seconds":
			label = "command (exit 0)"
		case "sandkeep_gate_wait_seconds":
			label = "gate wait"
		default:
			continue
		}
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "sandkeep_exec_duration_seconds" && labelOf(m, "outcome") != "ok" {
				continue
			}
			h := m.GetHistogram()
			if h.GetSampleCount() == 0 {
				continue
			}
			for _, q := range []float64{.5, .9, .99} {
				bars = append(bars, bar{Label: label + " p" + formatCount(q*100), Value: histogramQuantile(h, q) * 1000})
			}
		}
	}
	return barChart("The server's own histograms since it started (ms, estimated from buckets)", bars, func(v float64) string { return fmtMS(int64(v)) })
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// histogramQuantile estimates quantile q of h the way Prometheus' histogram_quantile does: linear within the
// bucket that holds the rank; past the last finite bound, that bound.
func histogramQuantile(h *dto.Histogram, q float64) float64 {
	total := float64(h.GetSampleCount())
	rank := q * total
	bs := slices.Clone(h.GetBucket())
	sort.Slice(bs, func(i, j int) bool { return bs[i].GetUpperBound() < bs[j].GetUpperBound() })
	lower, prev := 0.0, 0.0
	for _, b := range bs {
		c := float64(b.GetCumulativeCount())
		if c >= rank {
			if c == prev {
				return b.GetUpperBound()
			}
			return lower + (b.GetUpperBound()-lower)*(rank-prev)/(c-prev)
		}
		lower, prev = b.GetUpperBound(), c
	}
	return lower
}
