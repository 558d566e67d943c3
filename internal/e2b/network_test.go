package e2b

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/e2b/proto/process"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	skproc "github.com/sandkeep/sandkeep/processes"
)

// TestCallerNetwork: E2B's network fields become the caller's block over the template's network, or a refusal;
// none of them is dropped unread.
func TestCallerNetwork(t *testing.T) {
	no, yes := false, true
	cases := []struct {
		name  string
		allow *bool
		net   string
		want  string // netString of the block; "-" for nil (the template's network)
		code  string // the refusal's code
	}{
		{"nothing", nil, ``, "-", ""},
		{"internet allowed", &yes, ``, "-", ""},
		{"internet refused", &no, ``, "none", ""},
		{"deny all", nil, `{"denyOut":["0.0.0.0/0"]}`, "none", ""},
		{"deny all v6", nil, `{"denyOut":["::/0"]}`, "none", ""},
		{"allowlist", nil, `{"allowOut":["1.1.1.1","8.8.8.0/24","api.example.com"],"denyOut":["0.0.0.0/0"]}`,
			"allowlist 1.1.1.1 8.8.8.0/24 api.example.com", ""},
		{"wildcard below a name, not the name", &no, `{"allowOut":["*.example.com"]}`, "allowlist **.example.com !example.com", ""},
		{"allowOut alone fails closed", nil, `{"allowOut":["api.example.com"]}`, "allowlist api.example.com", ""},
		{"public traffic either way", nil, `{"allowPublicTraffic":true}`, "-", ""},
		{"single denials", nil, `{"denyOut":["1.2.3.4"]}`, "", "NETWORK_INVALID"},
		{"transforms carry credentials", nil, `{"allowOut":["a.example"],"rules":{"a.example":[{"transform":{"headers":{"Authorization":"x"}}}]}}`, "", "NETWORK_WIDENED"},
		{"egress proxy", nil, `{"egressProxy":{"address":"proxy.example:1080"}}`, "", "NETWORK_INVALID"},
		{"mask request host", nil, `{"maskRequestHost":"x.example"}`, "", "NETWORK_INVALID"},
		{"https ports", nil, `{"httpsPorts":[3000]}`, "", "NETWORK_INVALID"},
		{"an unknown field", nil, `{"allowOutt":["a.example"]}`, "", "NETWORK_INVALID"},
		{"a negation", nil, `{"allowOut":["!a.example"]}`, "", "NETWORK_INVALID"},
		{"every host", nil, `{"allowOut":["**"]}`, "", "NETWORK_INVALID"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, err := parseNetwork(json.RawMessage(c.net))
			var block *sandkeep.Network
			if err == nil {
				block, err = callerNetwork(c.allow, n)
			}
			if c.code != "" {
				if err == nil || !strings.Contains(err.Error(), c.code) {
					t.Fatalf("got %v, %v; want %s", block, err, c.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := "-"
			if block != nil {
				got = netString(block)
				if block.Inherit != "replace" {
					t.Errorf("inherit %q: a caller's block replaces (it is checked against the template's)", block.Inherit)
				}
			}
			if got != c.want {
				t.Errorf("block %q, want %q", got, c.want)
			}
		})
	}
}

// FuzzCallerNetwork: whatever the network object, the block is nil (the template's), none, or an allowlist of
// entries the caller listed; never another mode, and never nil when internet access was turned off.
func FuzzCallerNetwork(f *testing.F) {
	for _, s := range []string{`{}`, `{"allowOut":["*.a.b"],"denyOut":["0.0.0.0/0"]}`, `{"denyOut":["1.2.3.4"]}`,
		`{"rules":{}}`, `{"allowOut":[""]}`, `null`, `{"allowPublicTraffic":false}`} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, s string, internet bool) {
		n, err := parseNetwork(json.RawMessage(s))
		if err != nil {
			return
		}
		block, err := callerNetwork(&internet, n)
		if err != nil {
			return
		}
		if block == nil {
			if !internet {
				t.Fatalf("%s with internet off left the template's network", s)
			}
			return
		}
		if block.Mode != "none" && block.Mode != "allowlist" || block.Inherit != "replace" {
			t.Fatalf("%s: block %+v", s, block)
		}
		for _, r := range block.Rules {
			if r == "**" || (!strings.HasPrefix(r, "!") && !strings.HasPrefix(r, "**.") && !containsEntry(n.AllowOut, r)) {
				t.Fatalf("%s: rule %q is not one the caller listed", s, r)
			}
		}
	})
}

func containsEntry(list []string, r string) bool {
	for _, a := range list {
		if strings.TrimSpace(a) == r {
			return true
		}
	}
	return false
}

// TestNetworkFront: create admits its network before anything is made (a refusal leaves nothing), every later
// command of the sandbox carries it, getInfo returns it; the network update (PUT .../network) replaces it
// through the same admission, refuses a widening without changing anything, and waits for no engine process but
// refuses while a command holding the old network runs.
func TestNetworkFront(t *testing.T) {
	now := time.Unix(1_800_000_000, 0).UTC()
	b := &fakeBackend{}
	h := newHarness(t, t.TempDir(), b, &now)
	networked := false
	h.f.networked = func(*sandkeep.Run) bool { return networked }
	var notes []string // the network_updated events recorded, by the sandbox they name
	h.f.noteUpdate = func(_ *sandkeep.Run, sandbox string) { notes = append(notes, sandbox) }

	// Refusals: nothing is admitted past them, nothing runs, nothing is recorded.
	for _, c := range []struct {
		body   string
		status int
		msg    string
	}{
		{`{"network":{"allowOut":["widen.example"],"denyOut":["0.0.0.0/0"]}}`, 403, "NETWORK_WIDENED"},
		{`{"network":{"rules":{"a.example":[{}]}}}`, 403, "NETWORK_WIDENED: network rules"},
		{`{"network":{"denyOut":["10.0.0.1"]}}`, 422, "NETWORK_INVALID: denyOut of single addresses"},
		{`{"network":{"egressProxy":{"address":"p:1080"}}}`, 422, "egressProxy is not supported"},
	} {
		st, body := h.do("POST", "/v2/sandboxes", "key-acme", c.body)
		if msg, _ := body["message"].(string); st != c.status || body["code"] != float64(c.status) || !strings.Contains(msg, c.msg) {
			t.Errorf("create %s: %d %v, want %d %q", c.body, st, body, c.status, c.msg)
		}
	}
	if recs, _ := h.f.recs.all(""); len(b.execs) != 0 || len(recs) != 0 {
		t.Fatalf("refused creates ran %v and left %d records", b.execs, len(recs))
	}

	// Internet access off: admitted with mode none, and the sandbox's commands carry it.
	st, body := h.do("POST", "/v2/sandboxes", "key-acme", `{"allow_internet_access":false}`)
	if st != 201 {
		t.Fatalf("create: %d %v", st, body)
	}
	id := body["sandboxID"].(string)
	if strings.Join(b.nets, ",") != "none,none" {
		t.Errorf("create admitted and ran with %q, want none twice", b.nets)
	}
	if st, body := h.do("GET", "/sandboxes/"+id, "key-acme", ""); st != 200 || body["allowInternetAccess"] != false {
		t.Errorf("getInfo: %d %v", st, body)
	}
	rec, _ := h.f.recs.get(id)
	if _, err := h.f.exec(t.Context(), b, rec, []string{"ls"}, nil); err != nil || b.nets[len(b.nets)-1] != "none" {
		t.Errorf("a later command ran with %q (%v), want none", b.nets[len(b.nets)-1], err)
	}

	// The update replaces it: an allowlist within the template's is admitted and recorded.
	b.nets, networked = nil, true
	st, body = h.do("PUT", "/sandboxes/"+id+"/network", "key-acme", `{"allowOut":["*.example.com"],"denyOut":["0.0.0.0/0"]}`)
	if st != 204 || strings.Join(b.nets, ",") != "allowlist **.example.com !example.com" {
		t.Fatalf("update: %d %v, admitted %q", st, body, b.nets)
	}
	if len(notes) != 1 || notes[0] != id {
		t.Errorf("network_updated recorded for %v, want once for %s", notes, id)
	}
	rec, _ = h.f.recs.get(id)
	if !rec.Networked || netString(rec.network()) != "allowlist **.example.com !example.com" {
		t.Errorf("after the update the record says %v %q", rec.Networked, netString(rec.network()))
	}
	if st, body := h.do("GET", "/sandboxes/"+id, "key-acme", ""); st != 200 || body["allowInternetAccess"] != nil ||
		body["network"].(map[string]any)["allowOut"].([]any)[0] != "*.example.com" {
		t.Errorf("getInfo after the update: %d %v", st, body)
	}

	// A widening is refused and changes nothing; so is an update while a command holding the network runs.
	if st, body := h.do("PUT", "/sandboxes/"+id+"/network", "key-acme", `{"allowOut":["widen.example"]}`); st != 403 || !strings.Contains(body["message"].(string), "NETWORK_WIDENED") {
		t.Errorf("widening update: %d %v", st, body)
	}
	p := &proc{sandbox: id, done: make(chan struct{}), info: &process.ProcessInfo{}}
	if err := h.f.procs.add(p); err != nil {
		t.Fatal(err)
	}
	if st, body := h.do("PUT", "/sandboxes/"+id+"/network", "key-acme", `{"allow_internet_access":false}`); st != 409 || !strings.Contains(body["message"].(string), "nothing was changed") {
		t.Errorf("update beside a running command: %d %v", st, body)
	}
	h.f.procs.remove(p.pid)
	rec, _ = h.f.recs.get(id)
	if netString(rec.network()) != "allowlist **.example.com !example.com" || len(notes) != 1 {
		t.Errorf("refused updates changed the network to %q (network_updated %v)", netString(rec.network()), notes)
	}
	// With it ended the update goes through, and clearing every field gives the template's network back.
	if st, _ := h.do("PUT", "/sandboxes/"+id+"/network", "key-acme", `{}`); st != 204 {
		t.Errorf("clearing update: %d", st)
	}
	if rec, _ = h.f.recs.get(id); rec.network() != nil {
		t.Errorf("a cleared network is %q, want the template's", netString(rec.network()))
	}
}

// netProcs is fakeBackend with the engine's process model: each start records the network block it carried to
// admission and runs until ended; a start whose block inspects (rule "inspect.example") is refused as the
// kubernetes driver refuses it, and noProcs makes every process call PROCESS_UNAVAILABLE.
type netProcs struct {
	*fakeBackend
	mu      sync.Mutex
	started []string
	running []skproc.Process
	noProcs bool
}

var _ service.ProcessBackend = (*netProcs)(nil)

func (b *netProcs) StartProcess(_ context.Context, _ sandkeep.Key, req skproc.StartRequest) (*skproc.Process, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.noProcs || req.Network != nil && slices.Contains(req.Network.Rules, "inspect.example") {
		return nil, fault.New(fault.ProcessUnavailable, "give the template inspect: off", "no processes here")
	}
	b.started = append(b.started, netString(req.Network))
	b.running = append(b.running, skproc.Process{PID: 100 + len(b.running), Running: true})
	return &b.running[len(b.running)-1], nil
}

func (b *netProcs) Processes(context.Context, sandkeep.Key) ([]skproc.Process, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.noProcs {
		return nil, fault.New(fault.ProcessUnavailable, "use the agent channel", "no processes here")
	}
	return slices.Clone(b.running), nil
}

func (b *netProcs) AttachProcess(context.Context, sandkeep.Key, skproc.Ref, skproc.AttachOptions) (*skproc.Process, error) {
	return nil, nil
}
func (b *netProcs) SendInput(context.Context, sandkeep.Key, skproc.Ref, []byte) error { return nil }
func (b *netProcs) CloseStdin(context.Context, sandkeep.Key, skproc.Ref) error        { return nil }
func (b *netProcs) KillProcess(context.Context, sandkeep.Key, skproc.Ref) error       { return nil }
func (b *netProcs) SignalProcess(context.Context, sandkeep.Key, skproc.Ref, syscall.Signal) error {
	return nil
}
func (b *netProcs) ResizeProcess(context.Context, sandkeep.Key, skproc.Ref, sandkeep.WindowSize) error {
	return nil
}

// TestNetworkBesideProcesses: a command's start reads the sandbox's network block under the update's lock and
// counts as running until the engine lists it, and a running engine process holds the network too, so an update
// of a sandbox with a network waits for neither (409, nothing changed) and goes through once none runs. A start
// refused PROCESS_UNAVAILABLE for its own network is that command's answer; only an engine whose list says the
// same has no processes (the exec path from then on).
func TestNetworkBesideProcesses(t *testing.T) {
	now := time.Unix(1_800_000_000, 0).UTC()
	b := &netProcs{fakeBackend: &fakeBackend{}}
	f, err := New(Config{Dir: t.TempDir(), MaxTimeout: time.Hour, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(f.Handler(b, fakeHooks()))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { f.Close() })
	h := &harness{t: t, b: b.fakeBackend, f: f, srv: srv}
	f.networked = func(*sandkeep.Run) bool { return true }

	st, body := h.do("POST", "/v2/sandboxes", "key-acme", `{"network":{"allowOut":["*.example.com"],"denyOut":["0.0.0.0/0"]}}`)
	if st != 201 {
		t.Fatalf("create: %d %v", st, body)
	}
	id := body["sandboxID"].(string)
	rec, _ := f.recs.get(id)
	sc := &sandboxCtx{rec: rec, key: sandkeep.Key{Tenant: "acme", User: rec.user()}, b: b}
	update := func(body string) (int, string) {
		st, out := h.do("PUT", "/sandboxes/"+id+"/network", "key-acme", body)
		msg, _ := out["message"].(string)
		return st, msg
	}

	block, started, err := f.startNetwork(id)
	if err != nil || netString(block) != "allowlist **.example.com !example.com" {
		t.Fatalf("a start reads %q (%v), want the sandbox's block", netString(block), err)
	}
	if st, msg := update(`{"allow_internet_access":false}`); st != 409 || !strings.Contains(msg, "nothing was changed") {
		t.Errorf("update while a start is under way: %d %q, want 409", st, msg)
	}
	if _, err := b.StartProcess(t.Context(), sc.key, skproc.StartRequest{Network: block}); err != nil {
		t.Fatal(err)
	}
	started()
	started() // once only
	if st, msg := update(`{"allow_internet_access":false}`); st != 409 {
		t.Errorf("update while the engine's process runs: %d %q, want 409", st, msg)
	}
	b.mu.Lock()
	b.running[0].Running = false
	b.mu.Unlock()
	if st, msg := update(`{"allow_internet_access":false}`); st != 204 {
		t.Errorf("update once it ended: %d %q, want 204", st, msg)
	}
	if block, started, _ = f.startNetwork(id); netString(block) != "none" {
		t.Errorf("a start after the update reads %q, want none", netString(block))
	}
	started()

	// A start refused for its own network leaves the engine's processes in use; an engine without any does not.
	refused := fault.New(fault.ProcessUnavailable, "give the template inspect: off", "a process whose network inspects TLS")
	if f.noProcesses(t.Context(), sc, b, refused) || f.noEngineProcs.Load() {
		t.Error("a start refused for its network switched the front to the exec path")
	}
	b.noProcs = true
	if !f.noProcesses(t.Context(), sc, b, refused) || !f.noEngineProcs.Load() {
		t.Error("an engine whose list is PROCESS_UNAVAILABLE too: the front still asks it for processes")
	}
}
