package api

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// FuzzDecodeExec: any body either decodes into a request the engine's validator accepts and the library can take (a command, sane bounds, env
// entries that split back into the names given), or is refused with a request-level code; it never panics.
// Seeds: testdata/fuzz/FuzzDecodeExec.
func FuzzDecodeExec(f *testing.F) {
	f.Add([]byte(`{"argv":["ls","-l"],"env":{"A":"1"},"timeout":30,"workdir":"src","stdin":"x","output_limit":10,"run_id":"r"}`))
	f.Add([]byte(`{"command":"echo hi"}`))
	f.Add([]byte(`{"command":"echo hi","template":"small","trust":"untrusted","workdir":"../x"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, _, err := decodeExec(bytes.NewReader(body))
		if err == nil {
			err = req.Check() // the engine's one validator, which the backend applies before admission
		}
		if err != nil {
			switch fault.CodeOf(err) {
			case fault.RequestInvalid, fault.InvalidEnv, fault.InvalidTimeout, fault.InvalidArgument, fault.InvalidWorkdir:
			default:
				t.Fatalf("refusal %v has an unexpected code", err)
			}
			return
		}
		if len(req.Argv) == 0 {
			t.Fatal("accepted a request with no command")
		}
		if req.Timeout < 0 || req.Timeout > 24*time.Hour || req.OutputLimit < 0 {
			t.Fatalf("accepted bounds: timeout %v, output limit %d", req.Timeout, req.OutputLimit)
		}
		if !slices.IsSorted(req.Env) {
			t.Fatalf("env not in a stable order: %q", req.Env)
		}
		for _, kv := range req.Env {
			k, _, ok := strings.Cut(kv, "=")
			if !ok || k == "" || strings.ContainsRune(k, 0) {
				t.Fatalf("env entry %q", kv)
			}
		}
	})
}

// FuzzRequestParams: the path and query parsers of the file, run and event routes refuse with a request-level
// code or return values inside their bounds.
func FuzzRequestParams(f *testing.F) {
	f.Add("a/b.txt", "list=1&mode=0644")
	f.Add("../x", "user=bob&status=running&limit=5&before=2026-01-02T15:04:05Z")
	f.Add("", "after=3&limit=0&follow=true")
	f.Fuzz(func(t *testing.T, path, rawQuery string) {
		okCode := func(err error, codes ...fault.Code) {
			if err != nil && !slices.Contains(codes, fault.CodeOf(err)) {
				t.Fatalf("error %v has an unexpected code", err)
			}
		}
		err := checkPath(path)
		okCode(err, fault.InvalidPath)
		if err == nil && (strings.ContainsRune(path, 0) || slices.Contains(strings.Split(path, "/"), "..")) {
			t.Fatalf("path %q accepted", path)
		}
		q, err := url.ParseQuery(rawQuery)
		if err != nil {
			return
		}
		rf, err := parseRunsQuery(q)
		okCode(err, fault.RequestInvalid)
		if err == nil && (rf.Limit < 1 || rf.Limit > maxPage || rf.Tenant != "") {
			t.Fatalf("runs filter %+v", rf)
		}
		eq, err := parseEventsQuery(q)
		okCode(err, fault.RequestInvalid)
		if err == nil && (eq.after < 0 || eq.limit < 1 || eq.limit > 10*maxPage) {
			t.Fatalf("events query %+v", eq)
		}
		mode, err := parseMode(q.Get("mode"))
		okCode(err, fault.RequestInvalid)
		if err == nil && mode&^0o777 != 0 {
			t.Fatalf("mode %o accepted", mode)
		}
		_, err = boolParam(q, "list")
		okCode(err, fault.RequestInvalid)
	})
}

// FuzzExecHandler sends any body to the exec route of a real handler: the answer is a result, a redirect or a
// 4xx, never a 5xx, and a refused body ran nothing.
func FuzzExecHandler(f *testing.F) {
	f.Add([]byte(`{"argv":["echo","x"]}`), "alice")
	f.Add([]byte(`{"command":"x","timeout":"1s"}`), "bob")
	f.Add([]byte(`{"argv":["a"]}{}`), "a%00b")
	e := newEnv(f, func(c *Config) { c.MaxBodyBytes = 4096 })
	h := e.srv.Handler()
	f.Fuzz(func(t *testing.T, body []byte, user string) {
		r, err := http.NewRequest("POST", "/v1/sandboxes/"+url.PathEscape(user)+"/exec", bytes.NewReader(body))
		if err != nil {
			return
		}
		r.Header.Set("Authorization", "Bearer "+e.tok)
		before, _ := e.be.Execs()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		after, _ := e.be.Execs()
		switch {
		case w.Code == http.StatusOK:
		case w.Code >= 300 && w.Code < 500: // 3xx: the mux cleaning a path such as /v1/sandboxes//exec
			if after != before {
				t.Fatalf("a %d ran a command: %s", w.Code, w.Body)
			}
		default:
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	})
}

// FuzzDecodeExecTTY: a TTY exec's first message either decodes into a request with a command and a terminal
// size within bounds and no stdin, or is refused with a request-level code; it never panics.
// Seeds: testdata/fuzz/FuzzDecodeExecTTY.
func FuzzDecodeExecTTY(f *testing.F) {
	f.Add([]byte(`{"argv":["sh"],"tty":{"rows":40,"cols":120}}`))
	f.Add([]byte(`{"command":"top","tty":{"rows":0,"cols":80}}`))
	f.Add([]byte(`{"argv":["sh"],"stdin":"x"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, _, err := decodeExecTTY(body)
		if err == nil {
			err = req.Check()
		}
		if err != nil {
			switch fault.CodeOf(err) {
			case fault.RequestInvalid, fault.InvalidEnv, fault.InvalidTimeout, fault.InvalidArgument, fault.InvalidWorkdir:
			default:
				t.Fatalf("refusal %v has an unexpected code", err)
			}
			return
		}
		if len(req.Argv) == 0 || req.TTY == nil || req.TTY.Size.Check() != nil || req.Stdin != nil {
			t.Fatalf("accepted %+v", req)
		}
	})
}
