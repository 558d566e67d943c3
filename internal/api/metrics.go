package api

import (
	"context"
	"net/http"
	"reflect"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/events"
)

// Exec outcomes, the values of the outcome label.
const (
	outcomeOK       = "ok"           // exit status 0
	outcomeNonzero  = "exit_nonzero" // ran and exited non-zero (or was killed by a signal)
	outcomeTimeout  = "timeout"      // hit its deadline; its process tree was killed
	outcomeError    = "error"        // refused or failed before or while running (a failure code)
	outcomeCanceled = "canceled"     // the caller went away; its process tree was killed
)

// metrics are the API's Prometheus metrics. Names are documented in docs/API.md.
type metrics struct {
	requests        *prometheus.CounterVec   // by route pattern and status
	requestDuration *prometheus.HistogramVec // by route pattern
	execs           *prometheus.CounterVec   // by outcome
	execDuration    *prometheus.HistogramVec // by outcome
	execsInFlight   prometheus.Gauge
	gateWait        prometheus.Histogram
	ensure          *prometheus.CounterVec // by decision
	networkBlocks   prometheus.Counter
	limited         *prometheus.CounterVec // by limit: requests, execs, sandboxes, files
}

func newMetrics(reg prometheus.Registerer, b *guarded) (*metrics, error) {
	latency := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sandkeep_api_requests_total",
			Help: "API requests by route pattern and HTTP status (499: the client went away)."}, []string{"route", "code"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sandkeep_api_request_duration_seconds",
			Help: "Time to answer an API request, by route pattern (streams count until they end).", Buckets: latency},
			[]string{"route"}),
		execs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sandkeep_execs_total",
			Help: "Commands by outcome: ok, exit_nonzero, timeout, error, canceled."}, []string{"outcome"}),
		execDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sandkeep_exec_duration_seconds",
			Help: "Time from admitting a command to its result, by outcome.", Buckets: latency}, []string{"outcome"}),
		execsInFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sandkeep_execs_in_flight",
			Help: "Commands running now."}),
		gateWait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sandkeep_gate_wait_seconds",
			Help:    "Time a command waited for its key's gate, from events that report it.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60}}),
		ensure: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sandkeep_ensure_decisions_total",
			Help: "How each command's sandbox was provided: reuse, start, create, recreate, adopt."}, []string{"decision"}),
		networkBlocks: prometheus.NewCounter(prometheus.CounterOpts{Name: "sandkeep_network_blocks_total",
			Help: "Connections the egress proxy refused (network_blocked events)."}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sandkeep_limit_refusals_total",
			Help: "Requests refused with 429 by tenant limit: requests, execs, sandboxes, files."}, []string{"limit"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.requestDuration, m.execs, m.execDuration, m.execsInFlight,
		m.gateWait, m.ensure, m.networkBlocks, m.limited, &sandboxCollector{b: b}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observeExec(ctx context.Context, res *sandkeep.ExecResult, err error, d time.Duration) {
	outcome := outcomeOK
	switch {
	case err != nil && ctx.Err() != nil:
		outcome = outcomeCanceled
	case err != nil:
		outcome = outcomeError
	case res.TimedOut:
		outcome = outcomeTimeout
	case res.ExitCode != 0:
		outcome = outcomeNonzero
	}
	m.execs.WithLabelValues(outcome).Inc()
	m.execDuration.WithLabelValues(outcome).Observe(d.Seconds())
}

// execObserver turns one command's events into metrics, then passes them on. The ensure decision is not an
// event of its own: it is read from the sandbox events that come before the command starts (none: reuse).
type execObserver struct {
	m    *metrics
	next sandkeep.Observer // the caller's own, if any

	mu                                    sync.Mutex // events arrive on the lifecycle's goroutine; be safe anyway
	recycled, adopted, created, restarted bool
	decided                               bool
}

// observer is o in the caller's place, telling the caller's own observer everything too.
func (o *execObserver) observer() sandkeep.Observer {
	return sandkeep.Observer{Event: o.event, Started: o.started}
}

func (o *execObserver) event(name string, payload any) {
	o.mu.Lock()
	switch name {
	case events.NameSandboxRecycled:
		o.recycled = true
	case events.NameSandboxAdopted:
		o.adopted = true
	case events.NameSandboxStarted:
		if p, ok := deref[events.SandboxStarted](payload); ok && p.Created {
			o.created = true
		} else {
			o.restarted = true
		}
	case events.NameNetworkBlocked:
		o.m.networkBlocks.Inc()
	}
	o.mu.Unlock()
	if w, ok := gateWait(payload); ok {
		o.m.gateWait.Observe(w.Seconds())
	}
	if o.next.Event != nil {
		o.next.Event(name, payload)
	}
}

// started counts the ensure decision once: a command that is retried after its sandbox was recycled starts twice.
func (o *execObserver) started() {
	o.mu.Lock()
	if !o.decided {
		o.decided = true
		o.m.ensure.WithLabelValues(o.decision()).Inc()
	}
	o.mu.Unlock()
	if o.next.Started != nil {
		o.next.Started()
	}
}

func (o *execObserver) decision() string {
	switch {
	case o.recycled:
		return "recreate"
	case o.adopted:
		return "adopt"
	case o.created:
		return "create"
	case o.restarted:
		return "start"
	}
	return "reuse"
}

// deref returns payload as a T, whether it was sent as a value or a pointer.
func deref[T any](payload any) (T, bool) {
	switch p := payload.(type) {
	case T:
		return p, true
	case *T:
		if p != nil {
			return *p, true
		}
	}
	var zero T
	return zero, false
}

// gateWait reads a GateWaitMS field (int64, milliseconds) from an event payload that has one. No payload of
// internal/events carries it yet; the histogram fills as soon as one does, without a change here.
func gateWait(payload any) (time.Duration, bool) {
	v := reflect.ValueOf(payload)
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return 0, false
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return 0, false
	}
	f := v.FieldByName("GateWaitMS")
	if !f.IsValid() || !f.CanInt() {
		return 0, false
	}
	return time.Duration(f.Int()) * time.Millisecond, true
}

// AllLister is an optional Backend capability: every sandbox of the installation in one call. With it, the
// sandboxes gauge counts them all; without it, it counts those of the tenants that made a request since start.
type AllLister interface {
	ListAll(ctx context.Context) ([]sandkeep.Sandbox, error)
}

// sandboxCollector reports sandkeep_sandboxes{state} by listing the sandboxes when Prometheus scrapes.
type sandboxCollector struct{ b *guarded }

var sandboxesDesc = prometheus.NewDesc("sandkeep_sandboxes",
	"Sandboxes by state, listed at scrape time (all of them with a backend that can list all; else those of the tenants seen since start).",
	[]string{"state"}, nil)

func (c *sandboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- sandboxesDesc }

func (c *sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var boxes []sandkeep.Sandbox
	if al, ok := c.b.Backend.(AllLister); ok {
		all, err := al.ListAll(ctx)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(sandboxesDesc, err)
			return
		}
		boxes = all
	} else {
		for _, t := range c.b.s.limits.tenants() {
			some, err := c.b.Backend.List(ctx, t)
			if err != nil {
				ch <- prometheus.NewInvalidMetric(sandboxesDesc, err)
				return
			}
			boxes = append(boxes, some...)
		}
	}
	counts := map[string]int{}
	for _, sb := range boxes {
		counts[sb.State]++
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), state)
	}
}

// metricsHandler serves the gatherer. A collector that fails (the backend does not list) loses its own
// metric only; the rest is still served.
func metricsHandler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}
