package api

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

func TestExecJSON(t *testing.T) {
	e := newEnv(t, nil)
	resp := e.exec("alice", `{"argv":["echo","hi","there"],"env":{"B":"2","A":"1"},"timeout":2.5,"workdir":"src",
		"output_limit":1000,"stdin":"ignored"}`, RequestIDHeader, "client-7.a:b")
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get(RequestIDHeader); got != "client-7.a:b" {
		t.Errorf("X-Request-Id %q, want the client's", got)
	}
	// The answer has exactly the fields of `sandkeep exec --json` (sandkeep.ExecResult) and request_id.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &fields); err != nil {
		t.Fatal(err)
	}
	want := append(jsonFields(reflect.TypeFor[sandkeep.ExecResult]()), "request_id")
	got := mapKeys(fields)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("answer fields %v, want %v", got, want)
	}
	var res ExecResponse
	if err := json.Unmarshal([]byte(body), &res); err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "hi there\n" || res.ExitCode != 0 || res.RequestID != "client-7.a:b" || res.Sandbox.User != "alice" ||
		res.Sandbox.Tenant != "acme" {
		t.Errorf("result %+v", res)
	}
	_, req := e.be.Execs()
	if !slices.Equal(req.Argv, []string{"echo", "hi", "there"}) || !slices.Equal(req.Env, []string{"A=1", "B=2"}) ||
		req.Timeout != 2500*time.Millisecond || req.Workdir != "src" || req.OutputLimit != 1000 ||
		e.be.LastAdmit().RequestID != "client-7.a:b" || req.Stdin == nil {
		t.Errorf("backend got %+v", req)
	}

	// command runs through sh -c; stdin reaches the command.
	res = decodeJSON[ExecResponse](t, e.exec("alice", `{"command":"echo $X | tr a b"}`))
	if res.Stdout != "sh -c echo $X | tr a b\n" {
		t.Errorf("command ran as %q", res.Stdout)
	}
	res = decodeJSON[ExecResponse](t, e.exec("alice", `{"argv":["cat"],"stdin":"from stdin\n"}`))
	if res.Stdout != "from stdin\n" {
		t.Errorf("stdin: got %q", res.Stdout)
	}
}

func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		out = append(out, name)
	}
	return out
}

func mapKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestExecRequestIDs(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct{ name, in string }{
		{"none", ""},
		{"with a space", "a b"},
		{"too long", strings.Repeat("x", 129)},
		{"newline", "a\nb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := []string{}
			if tc.in != "" && !strings.Contains(tc.in, "\n") {
				hdr = []string{RequestIDHeader, tc.in}
			}
			resp := e.exec("alice", `{"argv":["true"]}`, hdr...)
			res := decodeJSON[ExecResponse](t, resp)
			id := resp.Header.Get(RequestIDHeader)
			if !strings.HasPrefix(id, "req_") || res.RequestID != id {
				t.Errorf("request id %q (answer %q), want a generated one", id, res.RequestID)
			}
		})
	}
	// The id is on every event the command recorded.
	resp := e.exec("bob", `{"argv":["true"]}`, RequestIDHeader, "trace-42")
	readAll(t, resp)
	runs, _ := e.be.Runs(context.Background(), store.RunFilter{Tenant: "acme", User: "bob"})
	evs, _ := e.be.Events(context.Background(), store.EventFilter{RunID: runs[0].ID})
	if len(evs) == 0 {
		t.Fatal("no events")
	}
	for _, ev := range evs {
		if ev.RequestID != "trace-42" {
			t.Errorf("event %s has request id %q", ev.Name, ev.RequestID)
		}
	}
}

func TestExecRefusesBadInputWithoutSideEffects(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxBodyBytes = 256 })
	for _, tc := range []struct {
		name, user, body string
		status           int
		code             fault.Code
	}{
		{"empty body", "u", ``, 400, fault.RequestInvalid},
		{"not JSON", "u", `{`, 400, fault.RequestInvalid},
		{"syntax error", "u", `{"argv":[}`, 400, fault.RequestInvalid},
		{"trailing object", "u", `{"argv":["a"]} {"argv":["b"]}`, 400, fault.RequestInvalid},
		{"trailing garbage", "u", `{"argv":["a"]}x`, 400, fault.RequestInvalid},
		{"unknown field", "u", `{"argv":["a"],"sudo":true}`, 400, fault.RequestInvalid},
		{"wrong type", "u", `{"argv":"ls"}`, 400, fault.RequestInvalid},
		{"array body", "u", `[1,2]`, 400, fault.RequestInvalid},
		{"null body", "u", `null`, 400, fault.RequestInvalid},
		{"argv and command", "u", `{"argv":["a"],"command":"b"}`, 400, fault.RequestInvalid},
		{"no command", "u", `{}`, 400, fault.RequestInvalid},
		{"empty argv", "u", `{"argv":[]}`, 400, fault.RequestInvalid},
		{"env name with =", "u", `{"command":"x","env":{"A=B":"c"}}`, 400, fault.InvalidEnv},
		{"env as list", "u", `{"command":"x","env":["A=B"]}`, 400, fault.RequestInvalid},
		{"timeout as duration", "u", `{"command":"x","timeout":"5s"}`, 400, fault.RequestInvalid},
		{"negative timeout", "u", `{"command":"x","timeout":-1}`, 400, fault.InvalidTimeout},
		{"huge timeout", "u", `{"command":"x","timeout":1e300}`, 400, fault.InvalidTimeout},
		{"negative output limit", "u", `{"command":"x","output_limit":-5}`, 400, fault.InvalidArgument},
		{"body past its bound", "u", `{"command":"x","stdin":"` + strings.Repeat("a", 300) + `"}`, 413, fault.RequestTooLarge},
		{"control character in user", "a%01b", `{"command":"x"}`, 400, fault.InvalidIdentity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, e.exec(tc.user, tc.body), tc.status, string(tc.code))
		})
	}
	if n, _ := e.be.Execs(); n != 0 {
		t.Errorf("the backend ran %d commands", n)
	}
	if boxes, _ := e.be.List(context.Background(), "acme"); len(boxes) != 0 {
		t.Errorf("sandboxes were created: %+v", boxes)
	}
}

// streamLines runs an exec with Accept: application/x-ndjson and returns its lines.
func streamLines(t *testing.T, e *env, user, body string) (*http.Response, []string) {
	t.Helper()
	resp := e.exec(user, body, "Accept", ctNDJSON)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, readAll(t, resp))
	}
	if ct := resp.Header.Get("Content-Type"); ct != ctNDJSON {
		t.Fatalf("Content-Type %q", ct)
	}
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return resp, lines
}

func TestExecStreamNDJSON(t *testing.T) {
	e := newEnv(t, nil)
	resp, lines := streamLines(t, e, "alice", `{"argv":["fake","out=a","err=b","out=c\n","exit=3"]}`)
	id := resp.Header.Get(RequestIDHeader)
	want := []string{
		`{"stream":"stdout","data":"a"}`,
		`{"stream":"stderr","data":"b"}`,
		`{"stream":"stdout","data":"c\n"}`,
	}
	if len(lines) != 4 || !slices.Equal(lines[:3], want) {
		t.Fatalf("lines:\n%s", strings.Join(lines, "\n"))
	}
	var final struct {
		Result ExecResponse `json:"result"`
	}
	if err := json.Unmarshal([]byte(lines[3]), &final); err != nil {
		t.Fatal(err)
	}
	if r := final.Result; r.ExitCode != 3 || r.Stdout != "" || r.RequestID != id || r.Sandbox.User != "alice" {
		t.Errorf("final %s", lines[3])
	}
}

func TestExecStreamSSE(t *testing.T) {
	e := newEnv(t, nil)
	resp := e.exec("alice", `{"argv":["fake","out=x","err=y"]}`, "Accept", "text/event-stream")
	body := readAll(t, resp)
	if resp.Header.Get("Content-Type") != ctSSE {
		t.Fatalf("Content-Type %q: %s", resp.Header.Get("Content-Type"), body)
	}
	msgs := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
	if len(msgs) != 3 ||
		msgs[0] != "event: stdout\ndata: {\"stream\":\"stdout\",\"data\":\"x\"}" ||
		msgs[1] != "event: stderr\ndata: {\"stream\":\"stderr\",\"data\":\"y\"}" ||
		!strings.HasPrefix(msgs[2], "event: result\ndata: {\"result\":{\"exit_code\":0,") {
		t.Fatalf("SSE body:\n%s", body)
	}
}

func TestExecStreamKeepsCharactersWhole(t *testing.T) {
	e := newEnv(t, nil)
	e.be.ExecHook = func(ctx context.Context, key sandkeep.Key, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
		for _, w := range []struct {
			to io.Writer
			s  string
		}{{req.Stdout, "h\xc3"}, {req.Stderr, "\xff\xfe"}, {req.Stdout, "\xa9llo"}, {req.Stdout, "\xe2\x82"}} {
			if _, err := io.WriteString(w.to, w.s); err != nil {
				return nil, err
			}
		}
		return &sandkeep.ExecResult{}, nil
	}
	_, lines := streamLines(t, e, "alice", `{"argv":["x"]}`)
	want := []string{
		`{"stream":"stdout","data":"h"}`,        // the cut "é" waits for its second byte
		`{"stream":"stderr","data_b64":"//4="}`, // not UTF-8: bytes, exactly
		`{"stream":"stdout","data":"éllo"}`,
		`{"stream":"stdout","data_b64":"4oI="}`, // cut at the end, never completed: sent as bytes
	}
	if len(lines) != 5 || !slices.Equal(lines[:4], want) {
		t.Fatalf("lines:\n%s", strings.Join(lines, "\n"))
	}
}

func TestExecStreamStatusBeforeAndErrorAfterStart(t *testing.T) {
	e := newEnv(t, nil)
	// Refused before the command starts: a real status, not a 200 stream.
	resp := e.exec("alice", `{"argv":["true"],"run_id":"nope"}`, "Accept", ctNDJSON)
	wantError(t, resp, http.StatusNotFound, string(fault.RunNotFound))

	// Failed after it started: the stream ends with an error line.
	e.be.ExecHook = func(ctx context.Context, key sandkeep.Key, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
		_, _ = io.WriteString(req.Stdout, "partial")
		return nil, fault.New(fault.AgentProtocol, "run it again", "the agent's report was cut off")
	}
	_, lines := streamLines(t, e, "alice", `{"argv":["x"]}`)
	if len(lines) != 2 || lines[0] != `{"stream":"stdout","data":"partial"}` ||
		lines[1] != `{"error":{"code":"AGENT_PROTOCOL","message":"the agent's report was cut off","hint":"run it again"}}` {
		t.Fatalf("lines:\n%s", strings.Join(lines, "\n"))
	}
}

// A client that goes away cancels its command's ctx: the library then kills the process tree.
func TestExecClientDisconnectCancelsCommand(t *testing.T) {
	for _, accept := range []string{"application/json", ctNDJSON, ctSSE} {
		t.Run(accept, func(t *testing.T) {
			e := newEnv(t, nil)
			started, cancelled := make(chan struct{}), make(chan struct{})
			e.be.ExecHook = func(ctx context.Context, key sandkeep.Key, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
				if req.Stdout != nil {
					_, _ = io.WriteString(req.Stdout, "working\n")
				}
				close(started)
				<-ctx.Done()
				close(cancelled)
				return &sandkeep.ExecResult{ExitCode: 137}, ctx.Err()
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r, _ := http.NewRequestWithContext(ctx, "POST", e.ts.URL+"/v1/sandboxes/alice/exec", strings.NewReader(`{"argv":["x"]}`))
			r.Header.Set("Authorization", "Bearer "+e.tok)
			r.Header.Set("Accept", accept)
			done := make(chan error, 1)
			go func() {
				resp, err := e.ts.Client().Do(r)
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				done <- err
			}()
			waitFor(t, started, "the command to start")
			cancel()
			waitFor(t, cancelled, "the command's ctx to be cancelled")
			if err := <-done; err == nil {
				t.Error("the client read a whole answer after cancelling")
			}
			waitUntil(t, func() bool { return strings.Contains(e.logs.String(), `"status":499`) }, "a 499 access log line")
			waitUntil(t, func() bool { return strings.Contains(scrape(t, e), `sandkeep_execs_total{outcome="canceled"} 1`) },
				"the canceled outcome metric")
		})
	}
}

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func waitUntil(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestStreamFormat(t *testing.T) {
	for _, tc := range []struct{ accept, want string }{
		{"", ""},
		{"application/json", ""},
		{"*/*", ""},
		{"application/x-ndjson", ctNDJSON},
		{"text/event-stream", ctSSE},
		{"application/json, application/x-ndjson", ""},
		{"application/x-ndjson; q=0.9, application/json", ctNDJSON},
		{"garbage;;, text/event-stream", ctSSE},
	} {
		r, _ := http.NewRequest("POST", "/", nil)
		r.Header.Set("Accept", tc.accept)
		if got := streamFormat(r); got != tc.want {
			t.Errorf("Accept %q: %q, want %q", tc.accept, got, tc.want)
		}
	}
}
