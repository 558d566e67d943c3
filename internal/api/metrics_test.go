package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/events"
)

// scrape returns the /metrics text of e.
func scrape(t *testing.T, e *env) string {
	t.Helper()
	resp, err := e.ts.Client().Get(e.ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return readAll(t, resp)
}

func wantMetric(t *testing.T, text string, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if !strings.Contains(text, "\n"+l+"\n") {
			t.Errorf("metrics lack %q", l)
		}
	}
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, nil)
	readAll(t, e.exec("alice", `{"argv":["true"]}`))                                   // create
	readAll(t, e.exec("alice", `{"argv":["fake","exit=2"]}`))                          // reuse
	readAll(t, e.exec("alice", `{"argv":["fake","timeout","event=network_blocked"]}`)) // reuse
	readAll(t, e.req("POST", "/v1/sandboxes/alice/stop", e.tok, nil))                  // then start
	readAll(t, e.exec("alice", `{"argv":["fake","event=network_blocked","exit=0"]}`))  // start
	readAll(t, e.exec("bob", `{"argv":["true"],"run_id":"missing"}`))                  // error
	readAll(t, e.req("GET", "/v1/sandboxes/nobody", e.tok, nil))                       // 404
	readAll(t, e.req("GET", "/v1/nowhere", "", nil))                                   // unmatched
	readAll(t, e.exec("alice", `{"argv":["fake","gatewait=250"]}`))

	text := scrape(t, e)
	wantMetric(t, text,
		`sandkeep_execs_total{outcome="ok"} 3`,
		`sandkeep_execs_total{outcome="exit_nonzero"} 1`,
		`sandkeep_execs_total{outcome="timeout"} 1`,
		`sandkeep_execs_total{outcome="error"} 1`,
		`sandkeep_exec_duration_seconds_count{outcome="ok"} 3`,
		`sandkeep_ensure_decisions_total{decision="create"} 1`,
		`sandkeep_ensure_decisions_total{decision="reuse"} 3`,
		`sandkeep_ensure_decisions_total{decision="start"} 1`,
		`sandkeep_network_blocks_total 2`,
		`sandkeep_gate_wait_seconds_sum 0.25`,
		`sandkeep_execs_in_flight 0`,
		`sandkeep_sandboxes{state="running"} 1`,
		`sandkeep_api_requests_total{code="200",route="POST /v1/sandboxes/{user}/exec"} 5`,
		`sandkeep_api_requests_total{code="404",route="POST /v1/sandboxes/{user}/exec"} 1`,
		`sandkeep_api_requests_total{code="204",route="POST /v1/sandboxes/{user}/stop"} 1`,
		`sandkeep_api_requests_total{code="404",route="GET /v1/sandboxes/{user}"} 1`,
		`sandkeep_api_requests_total{code="404",route="unmatched"} 1`,
	)
	if !strings.Contains(text, "go_goroutines") {
		t.Error("the private registry lacks the Go collector")
	}
}

func TestAccessLog(t *testing.T) {
	e := newEnv(t, nil)
	resp := e.exec("alice", `{"argv":["true"]}`, RequestIDHeader, "log-me")
	readAll(t, resp)
	readAll(t, e.req("GET", "/v1/sandboxes", "skt_wrong", nil))
	lines := strings.Split(strings.TrimSpace(e.logs.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d log lines:\n%s", len(lines), e.logs.String())
	}
	var ok, refused map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &ok); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &refused); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"msg": "request", "method": "POST", "route": "POST /v1/sandboxes/{user}/exec",
		"path": "/v1/sandboxes/alice/exec", "status": float64(200), "tenant": "acme", "request_id": "log-me"} {
		if ok[k] != want {
			t.Errorf("log %s = %v, want %v (%s)", k, ok[k], want, lines[0])
		}
	}
	for _, k := range []string{"bytes", "duration_ms", "token_id", "remote"} {
		if _, has := ok[k]; !has {
			t.Errorf("log lacks %s: %s", k, lines[0])
		}
	}
	if refused["status"] != float64(401) || refused["code"] != "UNAUTHENTICATED" || refused["tenant"] != nil {
		t.Errorf("refused request logged as %s", lines[1])
	}
	if strings.Contains(e.logs.String(), e.tok) || strings.Contains(e.logs.String(), "skt_wrong") {
		t.Error("a token reached the log")
	}
}

func TestEnsureDecisionFromEvents(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []string
		want   string
	}{
		{"nothing before the start", nil, "reuse"},
		{"created", []string{"created"}, "create"},
		{"started", []string{"started"}, "start"},
		{"recycled then created", []string{events.NameSandboxRecycled, "created"}, "recreate"},
		{"adopted", []string{events.NameSandboxAdopted}, "adopt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			o := &execObserver{m: e.srv.metrics}
			for _, ev := range tc.events {
				switch ev {
				case "created":
					o.event(events.NameSandboxStarted, events.SandboxStarted{Created: true})
				case "started":
					o.event(events.NameSandboxStarted, &events.SandboxStarted{})
				default:
					o.event(ev, nil)
				}
			}
			o.started()
			o.started() // a retry counts once
			wantMetric(t, scrape(t, e), `sandkeep_ensure_decisions_total{decision="`+tc.want+`"} 1`)
		})
	}
}

func TestHealthAndReady(t *testing.T) {
	e := newEnv(t, nil)
	if resp := e.req("GET", "/healthz", "", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("healthz %d", resp.StatusCode)
	}
	if resp := e.req("GET", "/readyz", "", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("readyz %d", resp.StatusCode)
	}
	e.be.ReadyErr = context.DeadlineExceeded // not a fault: its text must not reach the unauthenticated client
	eb := wantError(t, e.req("GET", "/readyz", "", nil), http.StatusServiceUnavailable, "DRIVER_UNAVAILABLE")
	if strings.Contains(eb.Message, "deadline") {
		t.Errorf("readyz leaks its cause: %+v", eb)
	}
}

// TestMetricsClosedByDefault: without a metrics token /metrics is refused unless the operator opened it.
func TestMetricsClosedByDefault(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MetricsOpen = false })
	resp, err := e.ts.Client().Get(e.ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, resp, http.StatusUnauthorized, "UNAUTHENTICATED")
	if s := scrape(t, newEnv(t, nil)); !strings.Contains(s, "# HELP") {
		t.Errorf("opened /metrics: %.200s", s)
	}
}
