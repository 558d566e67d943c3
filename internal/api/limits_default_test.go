package api

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/api/apitest"
	"github.com/sandkeep/sandkeep/internal/fault"
)

func TestResolveLimits(t *testing.T) {
	def := Limits{MaxSandboxes: 5, MaxConcurrentExecs: 4, RequestsPerSecond: 10, Burst: 20, MaxConcurrentFileOps: 3}
	for _, tc := range []struct {
		name    string
		in, out Limits
	}{
		{"zero takes every default", Limits{}, def},
		{"given values stay", Limits{MaxSandboxes: 1, MaxConcurrentExecs: 2, RequestsPerSecond: 3, Burst: 4, MaxConcurrentFileOps: 5},
			Limits{MaxSandboxes: 1, MaxConcurrentExecs: 2, RequestsPerSecond: 3, Burst: 4, MaxConcurrentFileOps: 5}},
		{"unlimited lifts each bound", Limits{MaxSandboxes: Unlimited, MaxConcurrentExecs: Unlimited, RequestsPerSecond: Unlimited, MaxConcurrentFileOps: Unlimited},
			Limits{}},
		{"a rate without a burst keeps the rate's own burst", Limits{RequestsPerSecond: 2},
			Limits{MaxSandboxes: 5, MaxConcurrentExecs: 4, RequestsPerSecond: 2, MaxConcurrentFileOps: 3}},
		{"a burst on the default rate", Limits{Burst: 7}, Limits{MaxSandboxes: 5, MaxConcurrentExecs: 4, RequestsPerSecond: 10, Burst: 7, MaxConcurrentFileOps: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resolveLimits(tc.in, def); got != tc.out {
				t.Errorf("resolveLimits(%+v) = %+v, want %+v", tc.in, got, tc.out)
			}
		})
	}
	if err := checkLimits("Limits", Limits{MaxSandboxes: -2}); err == nil {
		t.Error("-2 sandboxes accepted")
	}
	if err := checkLimits("Limits", Limits{RequestsPerSecond: -0.5}); err == nil {
		t.Error("-0.5 requests per second accepted")
	}
}

// A server configured with no limits at all still bounds a tenant: a flood of requests is refused with the
// code, the sentence and the hint the docs give, and another tenant is not affected.
func TestDefaultLimitsBoundATenant(t *testing.T) {
	clk := &clock{t: time.Now()} // no refill while the test runs
	e := newEnv(t, func(c *Config) { c.Now = clk.now })
	refused := 0
	for range DefaultLimits.Burst + 10 {
		resp := e.req("GET", "/v1/sandboxes", e.tok, nil)
		if resp.StatusCode == http.StatusTooManyRequests {
			eb := wantError(t, resp, http.StatusTooManyRequests, "RATE_LIMITED")
			if !strings.Contains(eb.Message, "requests per second") || !strings.Contains(eb.Hint, "raise the limit") {
				t.Fatalf("refusal %+v", eb)
			}
			refused++
			continue
		}
		readAll(t, resp)
	}
	if refused != 10 {
		t.Errorf("%d of %d requests refused, want 10 (the default burst is %d)", refused, DefaultLimits.Burst+10, DefaultLimits.Burst)
	}
	other, _ := e.tokens.Add("globex", ScopeRead)
	if resp := e.req("GET", "/v1/sandboxes", other, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("another tenant: %d", resp.StatusCode)
	}

	open := newEnv(t, func(c *Config) { c.Now = clk.now; c.Limits = Limits{RequestsPerSecond: Unlimited} })
	for i := range DefaultLimits.Burst + 10 {
		if resp := open.req("GET", "/v1/sandboxes", open.tok, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d with the rate lifted: %d", i, resp.StatusCode)
		}
	}
}

func (e *env) putAs(user, path, body string) *http.Response {
	return e.req("PUT", "/v1/sandboxes/"+user+"/files/"+path, e.tok, strings.NewReader(body))
}

// An upload that creates a workspace is one more sandbox of the tenant: past the limit it is refused before
// anything is created, and it counts against a later exec too.
func TestUploadsCountAgainstSandboxLimit(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Limits = Limits{MaxSandboxes: 2} })
	if resp := e.exec("alice", `{"argv":["true"]}`); resp.StatusCode != 200 {
		t.Fatalf("alice: %d %s", resp.StatusCode, readAll(t, resp))
	}
	if resp := e.putAs("bob", "a.txt", "hi"); resp.StatusCode != 200 {
		t.Fatalf("bob's upload: %d %s", resp.StatusCode, readAll(t, resp))
	}
	resp := e.putAs("carol", "a.txt", "hi")
	eb := wantError(t, resp, http.StatusTooManyRequests, "RATE_LIMITED")
	if resp.Header.Get("Retry-After") != "30" || !strings.Contains(eb.Message, "2 sandboxes") {
		t.Errorf("refusal %+v, Retry-After %q", eb, resp.Header.Get("Retry-After"))
	}
	wantError(t, e.req("GET", "/v1/sandboxes/carol/files/a.txt", e.tok, nil), http.StatusNotFound, "FILE_NOT_FOUND")
	wantError(t, e.exec("carol", `{"argv":["true"]}`), http.StatusTooManyRequests, "RATE_LIMITED")
	for _, u := range []string{"alice", "bob"} { // their workspaces exist: no new sandbox
		if resp := e.putAs(u, "b.txt", "again"); resp.StatusCode != 200 {
			t.Errorf("%s's second upload: %d %s", u, resp.StatusCode, readAll(t, resp))
		}
	}
	if resp := e.req("DELETE", "/v1/sandboxes/bob", e.tok, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete bob: %d", resp.StatusCode)
	}
	if resp := e.putAs("carol", "a.txt", "hi"); resp.StatusCode != 200 {
		t.Errorf("carol after bob was removed: %d %s", resp.StatusCode, readAll(t, resp))
	}
}

// A tenant's open file operations are bounded; a slow one holds its place until it ends, and gives it back.
func TestConcurrentFileOpsLimit(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Limits = Limits{MaxConcurrentFileOps: 1} })
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() }) // before the server's cleanup waits for the slow upload, if a check failed
	first := make(chan int, 1)
	go func() {
		resp := e.req("PUT", "/v1/sandboxes/alice/files/slow.txt", e.tok, pr)
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	if _, err := pw.Write([]byte("part")); err != nil {
		t.Fatal(err)
	}
	// The part written says the client sent it, not that the handler has taken its place yet (the server may
	// read it with the headers): until the slow upload holds the place, another one may pass; once it does, the
	// next is refused.
	var resp *http.Response
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp = e.putAs("bob", "x.txt", "x")
		if resp.StatusCode != http.StatusOK || time.Now().After(deadline) {
			break
		}
		resp.Body.Close()
		time.Sleep(10 * time.Millisecond)
	}
	eb := wantError(t, resp, http.StatusTooManyRequests, "RATE_LIMITED")
	if !strings.Contains(eb.Message, "file operations") || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("refusal %+v, Retry-After %q", eb, resp.Header.Get("Retry-After"))
	}
	other, _ := e.tokens.Add("globex", ScopeFiles)
	if resp := e.req("PUT", "/v1/sandboxes/bob/files/x.txt", other, strings.NewReader("x")); resp.StatusCode != 200 {
		t.Errorf("another tenant: %d", resp.StatusCode)
	}
	pw.Close()
	if got := <-first; got != 200 {
		t.Fatalf("the slow upload: %d", got)
	}
	if resp := e.putAs("bob", "x.txt", "x"); resp.StatusCode != 200 {
		t.Errorf("after the slow upload ended: %d", resp.StatusCode)
	}
}

// slowPut starts a PUT whose body is fed by the returned writer, and returns the channel of its answer.
func slowPut(e *env, path, contentType string) (*io.PipeWriter, <-chan *http.Response) {
	pr, pw := io.Pipe()
	ch := make(chan *http.Response, 1)
	go func() {
		r, _ := http.NewRequest("PUT", e.ts.URL+"/v1/sandboxes/alice/files/"+path, pr)
		r.Header.Set("Authorization", "Bearer "+e.tok)
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		resp, err := e.ts.Client().Do(r)
		if err != nil {
			e.t.Errorf("PUT %s: %v", path, err)
			close(ch)
			return
		}
		ch <- resp
	}()
	return pw, ch
}

// A slowloris upload, a file or a tar, is cut with UPLOAD_TOO_SLOW once a window brings less than the minimum
// rate, and leaves nothing behind: no file, no temporary file. A slow but steady upload passes.
func TestSlowUploadIsCut(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.UploadMinRate = 1000; c.UploadRateWindow = 300 * time.Millisecond })
	if resp := e.put("keep.txt", strings.NewReader("kept")); resp.StatusCode != 200 {
		t.Fatalf("a first upload: %d", resp.StatusCode)
	}
	var tarHead bytes.Buffer
	tw := tar.NewWriter(&tarHead)
	_ = tw.WriteHeader(&tar.Header{Name: "big.bin", Mode: 0o644, Size: 1 << 20, Typeflag: tar.TypeReg})
	for _, tc := range []struct{ name, path, ct, first string }{
		{"file", "stalled.txt", "", "part of a file"},
		{"tar", "tree", "application/x-tar", tarHead.String() + "part of an entry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			pw, answer := slowPut(e, tc.path, tc.ct)
			if _, err := pw.Write([]byte(tc.first)); err != nil {
				t.Fatal(err)
			}
			var resp *http.Response
			select {
			case resp = <-answer:
			case <-time.After(10 * time.Second):
				t.Fatal("a stalled upload was not cut")
			}
			pw.Close()
			if resp == nil {
				t.FailNow()
			}
			eb := wantError(t, resp, http.StatusRequestTimeout, "UPLOAD_TOO_SLOW")
			if !strings.Contains(eb.Message, "minimum of 1000 bytes per second") || eb.Hint == "" {
				t.Errorf("refusal %+v", eb)
			}
			if el := time.Since(start); el < 300*time.Millisecond {
				t.Errorf("cut after %v, before its window ended", el)
			}
			var names []string
			for _, en := range decodeJSON[FileList](t, e.get("?list=1")).Entries {
				names = append(names, en.Name)
			}
			if want := []string{"keep.txt"}; tc.name == "file" && !slices.Equal(names, want) ||
				tc.name == "tar" && !(slices.Equal(names, want) || slices.Equal(names, []string{"keep.txt", "tree"})) {
				t.Errorf("the workspace holds %v after the cut upload", names)
			}
			if tc.name == "tar" && slices.Contains(names, "tree") {
				if sub := decodeJSON[FileList](t, e.get("tree?list=1")).Entries; len(sub) != 0 {
					t.Errorf("the cut tar left %v", sub)
				}
			}
		})
	}

	t.Run("slow but steady", func(t *testing.T) {
		pw, answer := slowPut(e, "steady.txt", "")
		chunk := bytes.Repeat([]byte("s"), 500) // 5000 B/s against a minimum of 1000
		for range 8 {
			if _, err := pw.Write(chunk); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		pw.Close()
		resp := <-answer
		if resp == nil || resp.StatusCode != 200 {
			t.Fatalf("a steady upload: %v", resp)
		}
		resp.Body.Close()
	})
}

// listFails is a backend that cannot list its sandboxes (no engine, say).
type listFails struct{ *apitest.Backend }

func (listFails) List(context.Context, string) ([]sandkeep.Sandbox, error) {
	return nil, fault.New(fault.SandboxDriverUnavailable, "start the engine", "no driver")
}

// A backend that cannot list does not turn every command into the list's error: the command reaches the backend
// (which answers and records its own refusal) while the sandboxes this server knows of leave room, and only then
// is it refused.
func TestSandboxLimitWithoutList(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Backend = listFails{c.Backend.(*apitest.Backend)}
		c.Limits = Limits{MaxSandboxes: 1}
	})
	if resp := e.exec("alice", `{"argv":["true"]}`); resp.StatusCode != 200 {
		t.Fatalf("alice: %d %s", resp.StatusCode, readAll(t, resp))
	}
	if resp := e.exec("alice", `{"argv":["true"]}`); resp.StatusCode != 200 {
		t.Fatalf("alice again: %d %s", resp.StatusCode, readAll(t, resp))
	}
	wantError(t, e.exec("bob", `{"argv":["true"]}`), http.StatusServiceUnavailable, "SANDBOX_DRIVER_UNAVAILABLE")
	if n, _ := e.be.Execs(); n != 2 {
		t.Errorf("the backend ran %d commands, want 2 (alice's)", n)
	}
}
