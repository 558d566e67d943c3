package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/drivers"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/testutil"
	"github.com/sandkeep/sandkeep/stores"
)

// admissionCase is one row of the admission matrix: what the operator says (mode, trust), whether a sandboxing
// driver is usable, and the verdict every entry point must reach.
type admissionCase struct {
	name     string
	mode     string // --sandbox
	trust    string
	noDocker bool
	// The verdict, as the run row and the error say it.
	wantCode   string // "" when the command runs
	wantDriver string
	wantStatus string
	skipped    string // the sandbox_skipped event: "" none, "degraded" or "refused"
	// served, when set, is the verdict of the multi-tenant server's entry points (api, mcp-http), where it
	// differs by design: sandkeep serve offers no host passthrough unless its config names a host user.
	served *admissionCase
}

var admissionCases = []admissionCase{
	{name: "auto with docker", mode: "auto", trust: "trusted", wantDriver: "docker", wantStatus: store.StatusSucceeded},
	// The single-user entry points degrade loudly to the host; a server fails closed (issue 22, High 4: its
	// default used to turn an API exec into uid 0 on the host, every tenant's workspace readable).
	{name: "auto without docker", mode: "auto", trust: "trusted", noDocker: true, wantDriver: "host",
		wantStatus: store.StatusSucceeded, skipped: "degraded",
		served: &admissionCase{wantCode: "SANDBOX_DRIVER_UNAVAILABLE", wantStatus: store.StatusFailed, skipped: "refused"}},
	{name: "inline without docker", mode: "inline", trust: "trusted", noDocker: true, wantCode: "SANDBOX_DRIVER_UNAVAILABLE",
		wantStatus: store.StatusFailed, skipped: "refused"},
	{name: "untrusted none", mode: "none", trust: "untrusted", wantCode: "UNTRUSTED_WITHOUT_SANDBOX", wantStatus: store.StatusFailed},
	{name: "untrusted auto without docker", mode: "auto", trust: "untrusted", noDocker: true,
		wantCode: "UNTRUSTED_WITHOUT_SANDBOX", wantStatus: store.StatusFailed, skipped: "refused"},
}

// entryPoint runs one command for (tenant, user) under case ac and reports the failure code ("" when it ran)
// and what the command printed.
type entryPoint struct {
	name string
	run  func(t *testing.T, ac admissionCase, tenant string) (code, stdout string)
}

// TestAdmissionMatrix is the proof that every entry point goes through the same admission: the same (mode, trust,
// driver availability) through the CLI, the HTTP API, MCP over stdio, MCP over HTTP and the library gives the
// same decision, the same run row (mode, source, trust, driver, admission, status, failure code, disposition)
// and the same policy events.
func TestAdmissionMatrix(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	entries := []entryPoint{
		{"cli", func(t *testing.T, ac admissionCase, tenant string) (string, string) {
			env := envFor(ac)
			r := c.runWith(t, nil, env, "exec", "--tenant", tenant, "--user", "u", "--sandbox", ac.mode, "--trust", ac.trust,
				"--json", "--", "echo", "ran")
			return jsonCode(t, r)
		}},
		{"api", func(t *testing.T, ac admissionCase, tenant string) (string, string) {
			s := c.startServerEnv(t, envFor(ac), "--sandbox", ac.mode, "--trust", ac.trust)
			tok := c.createToken(t, tenant, "matrix", "").Token
			a := s.raw(t, "POST", "/v1/sandboxes/u/exec", tok, strings.NewReader(`{"argv":["echo","ran"]}`),
				"Content-Type", "application/json")
			return apiCode(t, a)
		}},
		{"mcp-stdio", func(t *testing.T, ac admissionCase, tenant string) (string, string) {
			cmd := c.command(bounded(t), append(transportEnv(), envFor(ac)...), "mcp", "--tenant", tenant, "--user", "u",
				"--sandbox", ac.mode, "--trust", ac.trust)
			cs := mcpConnect(t, &mcp.CommandTransport{Command: cmd})
			defer cs.Close()
			return mcpCode(t, mcpCall(t, cs, "exec", map[string]any{"argv": []string{"echo", "ran"}}))
		}},
		{"mcp-http", func(t *testing.T, ac admissionCase, tenant string) (string, string) {
			s := c.startServerEnv(t, envFor(ac), "--sandbox", ac.mode, "--trust", ac.trust)
			tok := c.createToken(t, tenant, "matrix", "").Token
			cs, err := s.mcpHTTP(t, map[string]string{"Authorization": "Bearer " + tok, "Sandkeep-User": "u"})
			if err != nil {
				t.Fatal(err)
			}
			return mcpCode(t, mcpCall(t, cs, "exec", map[string]any{"argv": []string{"echo", "ran"}}))
		}},
		{"library", func(t *testing.T, ac admissionCase, tenant string) (string, string) {
			m := c.library(t, ac.noDocker)
			key, _ := sandkeep.NewKey(tenant, "u")
			run, err := m.Admit(t.Context(), sandkeep.RunRequest{Key: key, Mode: ac.mode, Trust: ac.trust})
			if err != nil {
				return string(sandkeep.CodeOf(err)), ""
			}
			res, err := run.Exec(t.Context(), sandkeep.ExecRequest{Argv: []string{"echo", "ran"}})
			run.Finish(err)
			if err != nil {
				return string(sandkeep.CodeOf(err)), ""
			}
			return "", res.Stdout
		}},
	}
	for ci, ac := range admissionCases {
		t.Run(ac.name, func(t *testing.T) {
			first := map[bool]*admissionOutcome{} // by served: the entry points that must agree
			firstName := map[bool]string{}
			for ei, e := range entries {
				tenant := fmt.Sprintf("%s-m%d%d", c.ten("mx"), ci, ei)
				code, out := e.run(t, ac, tenant)
				got := c.outcome(t, tenant)
				got.code = code
				want, served := ac, ac.served != nil && (e.name == "api" || e.name == "mcp-http")
				if served {
					want = *ac.served
				}
				if code != want.wantCode {
					t.Errorf("%s: code %q, want %q", e.name, code, want.wantCode)
				}
				if code == "" && strings.TrimSpace(out) != "ran" {
					t.Errorf("%s: the command printed %q", e.name, out)
				}
				if got.row.Status != want.wantStatus || got.row.Driver != want.wantDriver || got.row.ResolvedMode != ac.mode ||
					got.row.Source != "cli" || got.row.Trust != ac.trust || got.skipped != want.skipped {
					t.Errorf("%s: run %+v, sandbox_skipped %q; want status %s, driver %q, mode %s from cli, trust %s, skipped %q",
						e.name, got.row, got.skipped, want.wantStatus, want.wantDriver, ac.mode, ac.trust, want.skipped)
				}
				if first[served] == nil {
					first[served], firstName[served] = &got, e.name
					continue
				}
				if got.key() != first[served].key() {
					t.Errorf("%s and %s disagree:\n %s\n %s", firstName[served], e.name, first[served].key(), got.key())
				}
			}
		})
	}

	// An attached run keeps the verdict it was admitted with: every command through the CLI, the API and the
	// library lands in the one run, which stays running.
	t.Run("attached", func(t *testing.T) {
		tenant := c.ten("mx-att")
		id := strings.TrimSpace(c.run(t, "runs", "start", "--tenant", tenant, "--user", "u", "--sandbox", "inline").want(t, 0).stdout)
		c.run(t, "exec", "--tenant", tenant, "--user", "u", "--run", id, "--", "true").want(t, 0)
		// Attached, the command's own flags decide nothing: asking for another mode is refused, not obeyed.
		c.run(t, "exec", "--tenant", tenant, "--user", "u", "--run", id, "--sandbox", "none", "--", "true").
			wantFailure(t, "INVALID_ARGUMENT")
		c.run(t, "exec", "--tenant", tenant, "--user", "u", "--run", id, "--", "true").want(t, 0)
		s := c.startServer(t)
		tok := c.createToken(t, tenant, "matrix", "").Token
		if a := s.raw(t, "POST", "/v1/sandboxes/u/exec", tok, strings.NewReader(`{"argv":["true"],"run_id":"`+id+`"}`)); a.status != http.StatusOK {
			t.Fatalf("API exec attached: %d %s", a.status, a.body)
		}
		m := c.library(t, false)
		key, _ := sandkeep.NewKey(tenant, "u")
		if _, err := m.Exec(t.Context(), key, sandkeep.ExecRequest{Argv: []string{"true"}, RunID: id}); err != nil {
			t.Fatal(err)
		}
		var runs []store.Run
		decodeJSON(t, c.run(t, "runs", "--json", "--tenant", tenant).want(t, 0).stdout, &runs)
		if len(runs) != 1 || runs[0].ID != id || runs[0].Status != store.StatusRunning || runs[0].Driver != "docker" ||
			runs[0].ResolvedMode != "inline" {
			t.Fatalf("runs: %+v", runs)
		}
		evs := c.eventsOf(t, id)
		if n := countNames(evs, "exec_finished"); n != 4 {
			t.Errorf("%d commands recorded in the attached run, want 4: %v", n, names(evs))
		}
		// The API's run endpoint admits the same way.
		a := s.raw(t, "POST", "/v1/sandboxes/u/runs", tok, strings.NewReader(`{"trust":"untrusted"}`))
		var started struct {
			ID, Trust, Mode, Driver, Admission string
		}
		if err := json.Unmarshal([]byte(a.body), &started); err != nil || a.status != http.StatusCreated ||
			started.Trust != "untrusted" || started.Admission != "admitted" || started.Driver != "docker" {
			t.Fatalf("POST runs: %d %s", a.status, a.body)
		}
		if a := s.raw(t, "POST", "/v1/runs/"+started.ID+"/finish", tok, strings.NewReader(`{}`)); a.status != http.StatusOK ||
			!strings.Contains(a.body, `"status":"succeeded"`) {
			t.Errorf("finish: %d %s", a.status, a.body)
		}
	})
}

// admissionOutcome is what one entry point left in the store for its run.
type admissionOutcome struct {
	row     store.Run
	skipped string // sandbox_skipped: "", "degraded" or "refused"
	policy  []string
	code    string
}

// key is what must be equal across entry points.
func (o admissionOutcome) key() string {
	r := o.row
	return fmt.Sprintf("code=%s mode=%s source=%s trust=%s driver=%s admission=%s status=%s failure=%s disposition=%s skipped=%s policy=%v",
		o.code, r.ResolvedMode, r.Source, r.Trust, r.Driver, r.Admission, r.Status, r.FailureCode, r.Disposition, o.skipped, o.policy)
}

// outcome reads tenant's one run and its policy events.
func (c *cli) outcome(t *testing.T, tenant string) admissionOutcome {
	t.Helper()
	var runs []store.Run
	decodeJSON(t, c.run(t, "runs", "--json", "--tenant", tenant).want(t, 0).stdout, &runs)
	if len(runs) != 1 {
		t.Fatalf("tenant %s: %d runs, want 1: %+v", tenant, len(runs), runs)
	}
	o := admissionOutcome{row: runs[0]}
	for _, e := range c.eventsOf(t, runs[0].ID) {
		switch e.Name {
		case "sandbox_skipped":
			o.skipped = "degraded"
			if strings.Contains(string(e.Payload), `"refused":true`) {
				o.skipped = "refused"
			}
			o.policy = append(o.policy, e.Name)
		case "sandbox_env_denied":
			o.policy = append(o.policy, e.Name)
		}
	}
	return o
}

func (c *cli) eventsOf(t *testing.T, runID string) []eventRecord {
	t.Helper()
	out := c.run(t, "events", "--run", runID, "--json").want(t, 0).stdout
	var evs []eventRecord
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var e eventRecord
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("event line %q: %v", line, err)
		}
		evs = append(evs, e)
	}
	return evs
}

func countNames(evs []eventRecord, name string) int {
	return len(slices.DeleteFunc(names(evs), func(n string) bool { return n != name }))
}

func envFor(ac admissionCase) []string {
	if ac.noDocker {
		return noDocker
	}
	return nil
}

// library opens an in-process Manager over c's home and store, offering the drivers the CLI offers; with
// noDocker its Docker driver points at a socket that does not exist.
func (c *cli) library(t *testing.T, noDockerEngine bool) *sandkeep.Manager {
	t.Helper()
	st, err := stores.Open(t.Context(), filepath.Join(c.home, "sandkeep.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	dock := drivers.Docker()
	if noDockerEngine {
		dock.New = func(sandkeep.DriverEnv) (sandkeep.Driver, error) {
			return docker.New(docker.Options{Host: strings.TrimPrefix(noDocker[0], "DOCKER_HOST=")})
		}
	}
	// Transport auto: the CLI and server processes of the test share the home, and only one serves a channel.
	m, err := sandkeep.Open(t.Context(), sandkeep.Config{Home: c.home, Image: testutil.TestImage(t), Transport: "auto",
		AgentPath: testutil.AgentBinary(t), Store: st, Drivers: []sandkeep.DriverOption{dock, sandkeep.HostDriver()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// jsonCode is the failure code of `exec --json` ("" when the command ran) and its stdout.
func jsonCode(t *testing.T, r result) (string, string) {
	t.Helper()
	var v struct {
		Error *struct {
			Code string `json:"code"`
		} `json:"error"`
		Stdout string `json:"stdout"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &v); err != nil {
		t.Fatalf("exec --json printed %q (stderr %q): %v", r.stdout, r.stderr, err)
	}
	if v.Error != nil {
		return v.Error.Code, ""
	}
	return "", v.Stdout
}

func apiCode(t *testing.T, a httpAnswer) (string, string) {
	t.Helper()
	var v struct {
		Code   string `json:"code"`
		Stdout string `json:"stdout"`
	}
	if err := json.Unmarshal([]byte(a.body), &v); err != nil {
		t.Fatalf("API answered %d %q: %v", a.status, a.body, err)
	}
	if a.status != http.StatusOK && v.Code == "" {
		t.Fatalf("API answered %d without a code: %s", a.status, a.body)
	}
	return v.Code, v.Stdout
}

// mcpCode is a tool result's failure code (the text of a tool error starts with it) or its stdout.
func mcpCode(t *testing.T, res *mcp.CallToolResult) (string, string) {
	t.Helper()
	if res.IsError {
		code, _, _ := strings.Cut(mcpText(res), ":")
		return code, ""
	}
	var out struct {
		Stdout string `json:"stdout"`
	}
	b, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(b, &out)
	return "", out.Stdout
}
