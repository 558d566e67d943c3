package sandkeep_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/testutil"
	"github.com/sandkeep/sandkeep/internal/testutil/kubetest"
)

// TestHostServices: an operator's host service (a small HTTP server of the test's own on the host's loopback),
// offered by a template, is reached from inside the sandbox at SANDKEEP_SERVICE_ECHO_URL with the run's token
// (SANDKEEP_SERVICE_ECHO_TOKEN), which never reaches the service; it is refused (401, before the service sees
// anything) without the token, and from another user's sandbox with the first run's token; the sandbox still has no
// route out and cannot reach the host's loopback directly. Opening, closing and each refusal are events of the
// runs. On a driver that cannot carry it (kubernetes, gVisor) the service is dropped with host_services_dropped and
// its variables are not set.
func TestHostServices(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	var sawAuth atomic.Bool
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("Authorization") != "" {
			sawAuth.Store(true)
		}
		fmt.Fprintf(w, "echo-service saw %s %s", r.Method, r.URL.Path)
	}))
	defer svc.Close()

	cfg := baseConfig(t)
	if onKube {
		cfg.Image = kubetest.ProbeImage
	} else {
		cfg.Image = testutil.ProbeImage(t)
	}
	cfg.HostServices = map[string]string{"echo": svc.URL + "/base"}
	cfg.Templates = map[string]sandkeep.Template{"svc": {Services: []string{"echo"}}}
	cfg = withStore(t, cfg, filepath.Join(t.TempDir(), "runs.db"))
	bad := cfg
	bad.Templates = map[string]sandkeep.Template{"svc": {Services: []string{"nope"}}}
	if _, err := sandkeep.Open(t.Context(), bad); sandkeep.CodeOf(err) != "INVALID_ARGUMENT" {
		t.Fatalf("a template offering an undefined service: %v, want INVALID_ARGUMENT", err)
	}
	bad.Templates, bad.HostServices = nil, map[string]string{"Echo!": svc.URL}
	if _, err := sandkeep.Open(t.Context(), bad); sandkeep.CodeOf(err) != "INVALID_ARGUMENT" {
		t.Fatalf("a service with a bad name: %v, want INVALID_ARGUMENT", err)
	}
	m, err := sandkeep.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !onKube {
		testutil.Cleanup(t, m.Installation())
	}
	exec := func(user, script string) (string, *sandkeep.Run) {
		t.Helper()
		run, err := m.Admit(t.Context(), sandkeep.RunRequest{Key: sandkeep.Key{Tenant: "acme", User: user}, Template: "svc"})
		if err != nil {
			t.Fatal(err)
		}
		res, err := run.Exec(t.Context(), sandkeep.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: time.Minute})
		run.Finish(err)
		if err != nil {
			t.Fatal(err)
		}
		return res.Stdout + res.Stderr, run
	}
	// A repository can neither register a service nor ask for one: TIER_REFUSED, before anything runs.
	for _, yaml := range []string{"sandbox:\n  services: [echo]\n", "sandbox:\n  host_services: {mine: {url: \"http://127.0.0.1:9\"}}\n"} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "sandkeep.yaml"), []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := m.Admit(t.Context(), sandkeep.RunRequest{Key: sandkeep.Key{Tenant: "acme", User: "repo"},
			Spec: filepath.Join(dir, "sandkeep.yaml")})
		if sandkeep.CodeOf(err) != "TIER_REFUSED" {
			t.Fatalf("a repository's %q: %v, want TIER_REFUSED", yaml, err)
		}
	}
	const get = `/bin/skprobe http "$SANDKEEP_SERVICE_ECHO_URL/hello"`
	const withToken = get + ` 'Authorization=Bearer $SANDKEEP_SERVICE_ECHO_TOKEN'`

	if onKube || cfg.Runtime == "runsc" {
		out, run := exec("alice", `echo "url=[$SANDKEEP_SERVICE_ECHO_URL] token=[$SANDKEEP_SERVICE_ECHO_TOKEN]"`)
		if !strings.Contains(out, "url=[] token=[]") {
			t.Fatalf("a dropped service's variables are set: %q", out)
		}
		ev := waitEvent[events.HostServicesDropped](t, cfg.Store, run.ID, events.NameHostServicesDropped)
		if !slices.Equal(ev.Services, []string{"echo"}) || ev.Why == "" {
			t.Fatalf("host_services_dropped: %+v", ev)
		}
		return
	}

	// With the run's token: through, at the operator's URL's path; the token stays with sandkeep.
	first, alice := exec("alice", `echo "url=$SANDKEEP_SERVICE_ECHO_URL"; echo "token=$SANDKEEP_SERVICE_ECHO_TOKEN"; `+withToken)
	if !strings.Contains(first, "url=http://127.0.0.1:3130") || !strings.Contains(first, "status 200") ||
		!strings.Contains(first, "echo-service saw GET /base/hello") {
		t.Fatalf("with the run's token: %q", first)
	}
	if hits.Load() != 1 || sawAuth.Load() {
		t.Fatalf("the service saw %d requests (want 1), an Authorization header: %v", hits.Load(), sawAuth.Load())
	}
	ev := waitEvent[events.HostServiceOpened](t, cfg.Store, alice.ID, events.NameHostServiceOpened)
	if ev.Service != "echo" || ev.Address != "http://127.0.0.1:3130" {
		t.Fatalf("host_service_opened: %+v", ev)
	}
	if ev := waitEvent[events.HostServiceClosed](t, cfg.Store, alice.ID, events.NameHostServiceClosed); ev.Requests != 1 {
		t.Fatalf("host_service_closed: %+v, want 1 request", ev)
	}

	// Without a token, or with a forged one: 401 before the service sees anything. No route out, and the
	// host's loopback (where the service listens) is not the sandbox's.
	hostPort := strings.TrimPrefix(svc.URL, "http://127.0.0.1:")
	out, alice2 := exec("alice", get+`; `+get+` 'Authorization=Bearer 0123'; cat /proc/net/route | wc -l; /bin/skprobe tcp 127.0.0.1:`+hostPort)
	if strings.Count(out, "status 401") != 2 || strings.Contains(out, "connected") {
		t.Fatalf("without the token / direct to the host: %q", out)
	}
	if lines := strings.Split(out, "\n"); !slices.Contains(lines, "1") { // /proc/net/route: its header only
		t.Fatalf("the sandbox has a route: %q", out)
	}
	if hits.Load() != 1 {
		t.Fatalf("the service saw %d requests, want still 1", hits.Load())
	}
	if ev := waitEvent[events.HostServiceRefused](t, cfg.Store, alice2.ID, events.NameHostServiceRefused); ev.Reason != "token-missing" {
		t.Fatalf("host_service_refused: %+v", ev)
	}

	// Another user's sandbox, with alice's token (which her command printed): refused.
	_, after, _ := strings.Cut(first, "token=")
	stolen, _, _ := strings.Cut(after, "\n")
	if len(stolen) != 64 {
		t.Fatalf("alice's token: %q", stolen)
	}
	out, bob := exec("bob", get+` 'Authorization=Bearer `+stolen+`'; `+withToken)
	if !strings.Contains(out, "status 401") || !strings.Contains(out, "status 200") {
		t.Fatalf("bob with alice's token, then his own: %q", out)
	}
	if ev := waitEvent[events.HostServiceRefused](t, cfg.Store, bob.ID, events.NameHostServiceRefused); ev.Reason != "token-invalid" {
		t.Fatalf("bob's host_service_refused: %+v", ev)
	}
	if hits.Load() != 2 {
		t.Fatalf("the service saw %d requests, want 2 (alice's and bob's own)", hits.Load())
	}
}

// waitEvent waits for run's first event called name (the store's group commit writes a command's last events
// after its Exec returned) and decodes it.
func waitEvent[T any](t *testing.T, st store.Store, run, name string) T {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs, err := st.ListEvents(t.Context(), store.EventFilter{RunID: run})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Name == name {
				var p T
				if err := json.Unmarshal(e.Payload, &p); err != nil {
					t.Fatal(err)
				}
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s has no %s event: %v", run, name, eventNames(evs))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
