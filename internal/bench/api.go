package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/api"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/stores"
)

// Defaults of APIOptions' zero fields: issue 5's load is 50 concurrent clients over 20 users, 10,000 requests.
const (
	DefaultAPIN        = 500   // warm exec samples per series (library, API) of the side-by-side row
	DefaultAPIRequests = 10000 // requests of the sustained load through the API (and as many through the library)
	DefaultAPIClients  = 50
	DefaultAPIUsers    = 20
)

// heapMarks is how many times the load samples the heap, besides its start: after each tenth of the requests.
const heapMarks = 10

// APIOptions sizes the api scenario. Zero fields take the defaults.
type APIOptions struct {
	// Postgres, when set, is the DSN of a PostgreSQL database the served rows also record into (a row of its own).
	Postgres string
	N        int // samples per series of the side-by-side warm exec
	Requests int // requests of the sustained load through the API; the library baseline runs as many
	Clients  int // concurrent clients of the load, each with a keep-alive connection of its own
	Users    int // users (one warm sandbox each) the load's requests go to, in turn
}

func (o APIOptions) withDefaults() APIOptions {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.N, DefaultAPIN)
	def(&o.Requests, DefaultAPIRequests)
	def(&o.Clients, DefaultAPIClients)
	def(&o.Users, DefaultAPIUsers)
	return o
}

// API measures what the HTTP API adds to the library, in one process: Env.M behind the real service Backend
// and an api.Server on a loopback TCP listener (the timeouts and bounds of `sandkeep serve`), a token of the
// run's tenant in an SQLite store of its own, and callers using the Go SDK over keep-alive connections.
//
// It returns two rows. The first: warm `true` through the API (SDK Exec) vs Manager.Exec, same user and same
// sandbox, rotated; Extra has the added latency (API median - library median). The second: a sustained load of
// o.Requests warm `true` by o.Clients concurrent clients over o.Users users, through the API vs through the
// library with the same clients and users, in the order library, API, API, library (halves of o.Requests each,
// so drift falls on both alike). Every result is checked (exit 0, agent transport, the caller's tenant and user,
// and over the API its own request id); the server counts the results it produced, so a result that never
// reached its client shows as lost. Any error or lost result fails the scenario. Extra has execs/s and CPU time
// per exec of each side, the error and lost counts, and the process's Go heap in use after a GC at the start of
// the API's requests and after each tenth of them (no request in flight), with the growth per 1,000 requests
// (least-squares slope, overall and over the second half), goroutines and RSS. The clients live in the same
// process: CPU, heap and RSS are the server's and its callers' together.
func API(ctx context.Context, e *Env, o APIOptions) (_ []Result, err error) {
	o = o.withDefaults()
	const warmUser = "api-warm"
	users := []string{warmUser}
	for i := range o.Users {
		users = append(users, "api-"+strconv.Itoa(i))
	}
	defer func() { err = errors.Join(err, e.removeUsers(ctx, users)) }()

	srv, err := startAPIServer(ctx, e, e.M, "")
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, srv.close(ctx)) }()

	// The sandboxes exist before anything is timed.
	res, err := e.skTrue(ctx, warmUser)
	if err != nil {
		return nil, err
	}
	sandbox := res.Sandbox.ID
	if err := forEach(ctx, o.Users, 8, func(ctx context.Context, i int) error {
		_, err := e.skTrue(ctx, users[1+i])
		return err
	}); err != nil {
		return nil, fmt.Errorf("api setup: %w", err)
	}

	side, err := apiSideBySide(ctx, e, srv, warmUser, sandbox, o.N)
	if err != nil {
		return nil, err
	}
	served, err := apiServed(ctx, e, warmUser, sandbox, o)
	if err != nil {
		return nil, err
	}
	load, err := apiLoad(ctx, e, srv, users[1:], o)
	if err != nil {
		return nil, err
	}
	return append(append([]Result{side}, served...), load), nil
}

// apiServer is the API as `sandkeep serve` runs it, on 127.0.0.1:0: the service Backend over Env.M, tokens in
// an SQLite store in a temporary directory, the http.Server of api.Server.HTTPServer.
type apiServer struct {
	url     string
	token   string
	dir     string
	st      store.Store
	m       *sandkeep.Manager // the Manager opened for this server (nil when it serves Env.M)
	srv     *api.Server
	hs      *http.Server
	backend *countingBackend
	served  chan error // Serve's return; the goroutine that sends it is owned by close
}

// countingBackend counts the results the service produced, so that the load can tell a result the server made
// but the client never got (lost) from one that was never made (an error).
type countingBackend struct {
	*service.Service // keeps the optional api.AllLister of the real backend
	results          atomic.Int64
}

func (b *countingBackend) Exec(ctx context.Context, key sandkeep.Key, ar service.AdmitRequest, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
	res, err := b.Service.Exec(ctx, key, ar, req)
	if err == nil && res != nil {
		b.results.Add(1)
	}
	return res, err
}

var _ service.Backend = (*countingBackend)(nil)

// startAPIServer serves m. Its tokens live in the store at dsn (a fresh SQLite file in a temporary directory when
// empty); when m is nil, a Manager is opened on e's home recording its runs and events into that store, as
// `sandkeep serve` does, and closed with the server. configure amends the server's config (the e2b scenario
// mounts the E2B front).
func startAPIServer(ctx context.Context, e *Env, m *sandkeep.Manager, dsn string, configure ...func(*api.Config)) (_ *apiServer, err error) {
	s := &apiServer{}
	if s.dir, err = os.MkdirTemp("", "sandkeep-bench-api-"); err != nil {
		return nil, fmt.Errorf("api server: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.close(ctx))
		}
	}()
	if dsn == "" {
		dsn = filepath.Join(s.dir, "sandkeep.db")
	}
	if s.st, err = stores.Open(ctx, dsn); err != nil {
		return nil, err
	}
	if m == nil { // serve's wiring: the Manager records every run and its events into the same store
		if s.m, err = sandkeep.Open(ctx, e.withStore(s.st)); err != nil {
			return nil, err
		}
		m = s.m
	}
	_, s.token, err = auth.Create(ctx, s.st, auth.Spec{Tenant: e.Tenant, Name: "bench", Scopes: []string{auth.ScopeExec}}, time.Now())
	if err != nil {
		return nil, err
	}
	s.backend = &countingBackend{Service: service.New(m, s.st, files.Limits{}, service.Admission{})}
	// The access log is formatted as serve formats it (JSON, one line a request) and dropped: its cost is the
	// API's, the terminal's is not.
	// No tenant limits: the benchmark is one tenant driving the server as hard as it can.
	unlimited := api.Limits{MaxSandboxes: api.Unlimited, MaxConcurrentExecs: api.Unlimited, RequestsPerSecond: api.Unlimited,
		MaxConcurrentFileOps: api.Unlimited}
	cfg := api.Config{Backend: s.backend, Tokens: s.st, Limits: unlimited, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}
	for _, c := range configure {
		c(&cfg)
	}
	s.srv, err = api.New(cfg)
	if err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("api server: %w", err)
	}
	s.hs = s.srv.HTTPServer(ln.Addr().String())
	s.url = "http://" + ln.Addr().String()
	s.served = make(chan error, 1)
	go func() { s.served <- s.hs.Serve(ln) }()
	return s, nil
}

// close drains the server as serve does on SIGTERM, shuts it down, and removes its store. It runs under its own
// timeout even when ctx was cancelled.
func (s *apiServer) close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var errs []error
	if s.hs != nil {
		errs = append(errs, s.srv.Drain(ctx), s.hs.Shutdown(ctx))
		if err := <-s.served; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	if s.m != nil {
		errs = append(errs, s.m.Close())
	}
	if s.st != nil {
		errs = append(errs, s.st.Close())
	}
	if s.dir != "" {
		errs = append(errs, os.RemoveAll(s.dir))
	}
	return errors.Join(errs...)
}

// client returns an SDK client with a keep-alive connection pool of its own (a clone of net/http's default
// transport, as a program using the SDK has), and the transport to close its idle connections with.
func (s *apiServer) client() (*client.Client, *http.Transport, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 4 // the default 2 would be enough for one caller; room for a retry's second one
	c, err := client.New(s.url, s.token, client.WithHTTPClient(&http.Client{Transport: tr}))
	return c, tr, err
}

// apiTrue runs `true` for user through c and checks the result: exit 0, agent transport, the run's tenant and
// user, and, when requestID is set, that the answer is the one to this request.
func apiTrue(ctx context.Context, c *client.Client, tenant, user, requestID string) (*client.ExecResult, error) {
	res, err := c.Exec(ctx, user, client.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute, RequestID: requestID})
	if err != nil {
		return nil, fmt.Errorf("api exec for %s: %w", user, err)
	}
	return res, checkAPIResult(res, tenant, user, requestID)
}

func checkAPIResult(res *client.ExecResult, tenant, user, requestID string) error {
	switch {
	case res.ExitCode != 0:
		return fmt.Errorf("api exec for %s exited %d: %s", user, res.ExitCode, res.Stderr)
	case res.Transport != transportAgent:
		return fmt.Errorf("api exec for %s went over transport %q, want %q", user, res.Transport, transportAgent)
	case res.Sandbox.Tenant != tenant || res.Sandbox.User != user:
		return fmt.Errorf("api exec for %s/%s answered for %s/%s", tenant, user, res.Sandbox.Tenant, res.Sandbox.User)
	case requestID != "" && res.RequestID != requestID:
		return fmt.Errorf("api exec %s for %s got the answer of request %q", requestID, user, res.RequestID)
	}
	return nil
}

// apiSideBySide is the first row: `true` for user through the library and through the API, rotated.
func apiSideBySide(ctx context.Context, e *Env, srv *apiServer, user, sandbox string, n int) (Result, error) {
	c, tr, err := srv.client()
	if err != nil {
		return Result{}, err
	}
	defer tr.CloseIdleConnections()
	lib := func(ctx context.Context) error {
		res, err := e.skTrue(ctx, user)
		if err == nil && res.Sandbox.ID != sandbox {
			err = fmt.Errorf("library exec for %s ran in %s, want %s", user, res.Sandbox.ID, sandbox)
		}
		return err
	}
	viaAPI := func(ctx context.Context) error {
		res, err := apiTrue(ctx, c, e.Tenant, user, "")
		if err == nil && res.Sandbox.ID != sandbox {
			err = fmt.Errorf("api exec for %s ran in %s, want %s", user, res.Sandbox.ID, sandbox)
		}
		return err
	}
	// Not measured: the connection's dial, the store's first token lookup, first-use allocations on both paths.
	for range 10 {
		if err := errors.Join(lib(ctx), viaAPI(ctx)); err != nil {
			return Result{}, fmt.Errorf("api warm-up: %w", err)
		}
	}
	s, err := rotate(ctx, n, lib, viaAPI)
	if err != nil {
		return Result{}, fmt.Errorf("api side by side: %w", err)
	}
	r := newResult("warm exec `true` through the HTTP API (Go SDK, keep-alive TCP)", "the library: Manager.Exec, same sandbox", s[1], s[0])
	r.Extra = map[string]string{
		"transport":       transportAgent,
		"added_median_ms": msString(r.Sandkeep.Median - r.Base.Median),
		"added_p90_ms":    msString(r.Sandkeep.P90 - r.Base.P90),
		"store":           "sqlite",
	}
	return r, nil
}

// apiServed is `sandkeep serve` as it runs: warm `true` through the HTTP API of a server whose Manager records
// every command's run and events in its store (SQLite; PostgreSQL too when o.Postgres is set), rotated in one loop
// with the library without a store (user, same sandbox as the first row) and with a raw Engine-API exec of
// `true` in that sandbox's container. Each store's server has a user (a sandbox) of its own. Rows: each served
// path against the library, and against raw exec.
func apiServed(ctx context.Context, e *Env, libUser, sandbox string, o APIOptions) (_ []Result, err error) {
	type served struct {
		name, dsn, user string
		srv             *apiServer
		c               *client.Client
	}
	sv := []*served{{name: "SQLite", user: "api-served-sqlite"}}
	if o.Postgres != "" {
		sv = append(sv, &served{name: "PostgreSQL", dsn: o.Postgres, user: "api-served-postgres"})
	}
	var users []string
	for _, s := range sv {
		users = append(users, s.user)
	}
	defer func() { err = errors.Join(err, e.removeUsers(ctx, users)) }()
	for _, s := range sv {
		if s.srv, err = startAPIServer(ctx, e, nil, s.dsn); err != nil {
			return nil, fmt.Errorf("api served (%s): %w", s.name, err)
		}
		defer func() { err = errors.Join(err, s.srv.close(ctx)) }()
		var tr *http.Transport
		if s.c, tr, err = s.srv.client(); err != nil {
			return nil, err
		}
		defer tr.CloseIdleConnections()
	}
	series := []func(context.Context) error{
		func(ctx context.Context) error {
			res, err := e.skTrue(ctx, libUser)
			if err == nil && res.Sandbox.ID != sandbox {
				err = fmt.Errorf("library exec for %s ran in %s, want %s", libUser, res.Sandbox.ID, sandbox)
			}
			return err
		},
		func(ctx context.Context) error { return e.rawExec(ctx, sandbox, nil, "true") },
	}
	for _, s := range sv {
		series = append(series, func(ctx context.Context) error {
			_, err := apiTrue(ctx, s.c, e.Tenant, s.user, "")
			return err
		})
	}
	// Not measured: each server's sandbox is made and its channel connected; first-use costs on every path.
	for range 10 {
		for _, do := range series {
			if err := do(ctx); err != nil {
				return nil, fmt.Errorf("api served warm-up: %w", err)
			}
		}
	}
	samples, err := rotate(ctx, o.N, series...)
	if err != nil {
		return nil, fmt.Errorf("api served: %w", err)
	}
	var rows []Result
	for i, s := range sv {
		api := samples[2+i]
		lib := newResult("warm `true` through `sandkeep serve`'s HTTP API, runs and events recorded ("+s.name+")",
			"the library without a store: Manager.Exec", api, samples[0])
		lib.Extra = map[string]string{"transport": transportAgent, "store": s.name,
			"added_median_ms": msString(lib.Sandkeep.Median - lib.Base.Median)}
		raw := newResult("warm `true` through `sandkeep serve`'s HTTP API, runs and events recorded ("+s.name+")",
			"raw Engine-API exec in the same kind of container", api, samples[1])
		raw.Extra = map[string]string{"transport": transportAgent, "store": s.name}
		if raw.Ratio > 0 {
			raw.Extra["times_faster"] = strconv.FormatFloat(1/raw.Ratio, 'f', 1, 64)
		}
		rows = append(rows, lib, raw)
	}
	return rows, nil
}

// heapSample is the process's Go heap in use after a full GC, when done of the API's requests had returned.
type heapSample struct {
	done       int
	heapInuse  uint64 // bytes in spans holding at least one live object: what the heap occupies
	heapAlloc  uint64 // bytes of live objects: what the process keeps
	goroutines int
}

func sampleHeap(done int) heapSample {
	// Twice: the first GC moves sync.Pool contents to the pools' victim caches, the second frees them, so the
	// sample holds what the process keeps rather than how full its pools happen to be.
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return heapSample{done: done, heapInuse: ms.HeapInuse, heapAlloc: ms.HeapAlloc, goroutines: runtime.NumGoroutine()}
}

// rssAfterGC is the process's RSS once the heap is collected and its free pages returned.
func rssAfterGC() int64 {
	debug.FreeOSMemory()
	rss, _ := procStatusKB("self", "VmRSS")
	return rss
}

// tally is what one series of the load did: wall time, results, failures. The latencies go into a slice
// allocated before the first heap sample: a series that appended them would grow the heap it measures by eight
// bytes a request (and twice that while the slice doubles).
type tally struct {
	wall     time.Duration // the segments' own time: heap sampling between them is not on the clock
	cpu      time.Duration // this process's user+system CPU time over the segments: server and clients alike
	received int           // results that reached their client (checked or not)
	checked  int           // results that passed every check
	errs     int
	first    error
}

func (t *tally) add(o tally) {
	t.wall += o.wall
	t.cpu += o.cpu
	t.received += o.received
	t.checked += o.checked
	t.errs += o.errs
	if t.first == nil {
		t.first = o.first
	}
}

// loadRequest runs request j on behalf of worker w; received reports whether a result came back at all.
type loadRequest func(ctx context.Context, w, j int) (received bool, err error)

// segment runs requests from..to-1 with workers goroutines, each taking the next number when its previous
// request returns, and puts the latency of request j, when it succeeded, in lat[j] (else -1). It keeps going after a failure (the count is the point) but stops when ctx ends; the
// caller checks ctx.
func segment(ctx context.Context, from, to, workers int, lat []time.Duration, do loadRequest) tally {
	var next atomic.Int64
	next.Store(int64(from))
	per := make([]tally, workers)
	cpu0 := processCPU()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			t := &per[w]
			for {
				j := int(next.Add(1) - 1)
				if j >= to || ctx.Err() != nil {
					return
				}
				// A request that hangs becomes an error instead of a run that never ends.
				rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				t0 := time.Now()
				got, err := do(rctx, w, j)
				d := time.Since(t0)
				cancel()
				if got {
					t.received++
				}
				lat[j] = -1
				if err != nil {
					t.errs++
					if t.first == nil {
						t.first = err
					}
					continue
				}
				t.checked++
				lat[j] = d
			}
		})
	}
	wg.Wait()
	var sum tally
	for _, t := range per {
		sum.add(t)
	}
	sum.wall = time.Since(start)
	sum.cpu = processCPU() - cpu0
	return sum
}

// marks returns the request counts after which the heap is sampled: each tenth of requests, rounded up, and
// requests itself.
func marks(requests int) []int {
	var out []int
	for i := 1; i <= heapMarks; i++ {
		m := (requests*i + heapMarks - 1) / heapMarks
		if len(out) == 0 || m > out[len(out)-1] {
			out = append(out, m)
		}
	}
	return out
}

// apiLoad is the second row: the sustained load through the library and through the API.
func apiLoad(ctx context.Context, e *Env, srv *apiServer, users []string, o APIOptions) (Result, error) {
	clients := make([]*client.Client, o.Clients)
	for i := range clients {
		c, tr, err := srv.client()
		if err != nil {
			return Result{}, err
		}
		defer tr.CloseIdleConnections()
		clients[i] = c
	}
	user := func(j int) string { return users[j%len(users)] }
	viaLib := func(ctx context.Context, _, j int) (bool, error) {
		res, err := e.skTrue(ctx, user(j))
		if err == nil && (res.Sandbox.Tenant != e.Tenant || res.Sandbox.User != user(j)) {
			err = fmt.Errorf("library exec for %s/%s answered for %s/%s", e.Tenant, user(j), res.Sandbox.Tenant, res.Sandbox.User)
		}
		return res != nil, err
	}
	viaAPI := func(ctx context.Context, w, j int) (bool, error) {
		res, err := apiTrue(ctx, clients[w], e.Tenant, user(j), "bench-"+strconv.Itoa(j))
		return res != nil, err
	}
	// Not measured: every client opens its connection and every user's sandbox answers once on both paths.
	warm := max(o.Clients, len(users))
	for _, do := range []loadRequest{viaLib, viaAPI} {
		if t := segment(ctx, 0, warm, o.Clients, make([]time.Duration, warm), do); t.errs > 0 {
			return Result{}, fmt.Errorf("api load warm-up: %d of %d failed: %w", t.errs, warm, t.first)
		}
	}

	var lib, viaAPIt tally
	libLat, apiLat := make([]time.Duration, o.Requests), make([]time.Duration, o.Requests)
	heap := make([]heapSample, 0, 1+heapMarks)
	var rssBefore, rssAfter int64
	resultsBefore := srv.backend.results.Load()
	apiMarks := marks(o.Requests)
	runLib := func(from, to int) { lib.add(segment(ctx, from, to, o.Clients, libLat, viaLib)) }
	runAPI := func(from, to int) {
		if from == 0 {
			rssBefore = rssAfterGC()
			heap = append(heap, sampleHeap(0))
		}
		// Segments end at the marks, so that every sample is taken with no request in flight: the heap then
		// holds what the server keeps, not what 50 running requests hold for a moment.
		for _, m := range apiMarks {
			if m <= from || ctx.Err() != nil {
				continue
			}
			end := min(m, to)
			viaAPIt.add(segment(ctx, from, end, o.Clients, apiLat, viaAPI))
			if end == m {
				heap = append(heap, sampleHeap(m))
			}
			if from = end; from == to {
				break
			}
		}
		if to == o.Requests {
			rssAfter = rssAfterGC()
		}
	}
	half := o.Requests / 2
	runLib(0, half)
	runAPI(0, half)
	runAPI(half, o.Requests)
	runLib(half, o.Requests)
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	lost := int(srv.backend.results.Load()-resultsBefore) - viaAPIt.received
	if viaAPIt.errs > 0 || lib.errs > 0 || lost != 0 || viaAPIt.checked != o.Requests || lib.checked != o.Requests {
		return Result{}, fmt.Errorf("api load: through the API %d of %d requests failed and %d results were lost, "+
			"through the library %d failed; first: %w", viaAPIt.errs, o.Requests, lost, lib.errs, errors.Join(viaAPIt.first, lib.first))
	}

	r := newResult(fmt.Sprintf("sustained: %d clients over %d users, %d warm execs through the HTTP API (per exec)", o.Clients, len(users), o.Requests),
		"the library, same clients, users and count", apiLat, libLat)
	apiRate, libRate := float64(viaAPIt.checked)/viaAPIt.wall.Seconds(), float64(lib.checked)/lib.wall.Seconds()
	slope := heapSlope(heap)
	// The second half's slope tells a leak (it grows all along) from warm-up (pools, buffers and the runtime's
	// own structures reaching their size under this concurrency, early on).
	var late []heapSample
	for _, h := range heap {
		if 2*h.done >= o.Requests {
			late = append(late, h)
		}
	}
	peak := heap[0]
	var samples []string
	for _, h := range heap {
		if h.heapInuse > peak.heapInuse {
			peak = h
		}
		samples = append(samples, mibString(int64(h.heapInuse)))
	}
	first, last := heap[0], heap[len(heap)-1]
	r.Extra = map[string]string{
		"transport":                          transportAgent,
		"api_execs_per_s":                    strconv.FormatFloat(apiRate, 'f', 1, 64),
		"lib_execs_per_s":                    strconv.FormatFloat(libRate, 'f', 1, 64),
		"api_cpu_us_per_exec":                usPer(viaAPIt.cpu, viaAPIt.checked),
		"lib_cpu_us_per_exec":                usPer(lib.cpu, lib.checked),
		"api_vs_lib_throughput":              strconv.FormatFloat(apiRate/libRate, 'f', 3, 64),
		"api_p99_ms":                         msString(r.Sandkeep.P99),
		"lib_p99_ms":                         msString(r.Base.P99),
		"errors":                             strconv.Itoa(viaAPIt.errs + lib.errs),
		"lost_results":                       strconv.Itoa(lost),
		"results_checked":                    strconv.Itoa(viaAPIt.checked) + "+" + strconv.Itoa(lib.checked),
		"heap_inuse_start_mib":               mibString(int64(first.heapInuse)),
		"heap_inuse_peak_mib":                mibString(int64(peak.heapInuse)),
		"heap_inuse_end_mib":                 mibString(int64(last.heapInuse)),
		"heap_growth_per_1k_kib":             strconv.FormatFloat(slope*1000/(1<<10), 'f', 1, 64),
		"heap_growth_per_1k_second_half_kib": strconv.FormatFloat(heapSlope(late)*1000/(1<<10), 'f', 1, 64),
		"heap_alloc_start_end_mib":           mibString(int64(first.heapAlloc)) + "," + mibString(int64(last.heapAlloc)),
		"heap_inuse_samples_mib":             strings.Join(samples, ","),
		"goroutines_start_end":               strconv.Itoa(first.goroutines) + "," + strconv.Itoa(last.goroutines),
		"rss_before_after_mib":               mibString(rssBefore) + "," + mibString(rssAfter),
		"order":                              "lib,api,api,lib (halves)",
		"heap_sampled_after_every":           strconv.Itoa(apiMarks[0]) + " api requests",
	}
	return r, nil
}

// heapSlope is the least-squares slope of heap in use over requests done, in bytes per request: how fast the
// heap grows with the load, robust to one noisy sample in a way that end minus start is not.
func heapSlope(s []heapSample) float64 {
	if len(s) < 2 {
		return 0
	}
	var mx, my float64
	for _, p := range s {
		mx += float64(p.done)
		my += float64(p.heapInuse)
	}
	mx /= float64(len(s))
	my /= float64(len(s))
	var num, den float64
	for _, p := range s {
		dx := float64(p.done) - mx
		num += dx * (float64(p.heapInuse) - my)
		den += dx * dx
	}
	if den == 0 {
		return 0
	}
	return num / den
}

// processCPU is the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func msString(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

// usPer is d/n in microseconds: CPU time per request.
func usPer(d time.Duration, n int) string {
	return strconv.FormatFloat(float64(d)/float64(time.Microsecond)/float64(max(1, n)), 'f', 1, 64)
}

func mibString(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 2, 64) }
