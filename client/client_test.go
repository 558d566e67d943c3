package client_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/api"
	"github.com/sandkeep/sandkeep/internal/api/apitest"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

// The server the examples talk to (example_test.go): a real api.Server over the fake backend.
var (
	serverURL string
	token     string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sandkeep-client-example")
	if err != nil {
		panic(err)
	}
	tokens := apitest.NewTokens()
	token, _ = tokens.Add("acme", api.ScopeAdmin)
	srv, err := api.New(api.Config{Backend: apitest.NewBackend(dir), Tokens: tokens})
	if err != nil {
		panic(err)
	}
	ts := httptest.NewServer(srv.Handler())
	serverURL = ts.URL
	code := m.Run()
	ts.Close()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("internal/poll.runtime_pollWait")); err != nil {
			println("goleak:", err.Error())
			code = 1
		}
	}
	os.Exit(code)
}

// fixture is a client of a fresh server, and that server's fake backend.
type fixture struct {
	c      *client.Client
	be     *apitest.Backend
	tokens *apitest.Tokens
	url    string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	be, tokens := apitest.NewBackend(t.TempDir()), apitest.NewTokens()
	srv, err := api.New(api.Config{Backend: be, Tokens: tokens, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	tok, _ := tokens.Add("acme", api.ScopeAdmin)
	c, err := client.New(ts.URL+"/", tok, client.WithHTTPClient(ts.Client()))
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{c: c, be: be, tokens: tokens, url: ts.URL}
}

func TestExec(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	res, err := f.c.Exec(ctx, "alice", client.ExecRequest{Argv: []string{"fake", "out=hi", "err=oops", "exit=3"},
		Env: map[string]string{"A": "1"}, Timeout: 1500 * time.Millisecond, Workdir: "src", RequestID: "sdk-1"})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || res.Stdout != "hi" || res.Stderr != "oops" || res.RequestID != "sdk-1" ||
		res.Sandbox.Tenant != "acme" || res.Sandbox.User != "alice" {
		t.Errorf("result %+v", res)
	}
	_, req := f.be.Execs()
	if req.Timeout != 1500*time.Millisecond || !slices.Equal(req.Env, []string{"A=1"}) || req.Workdir != "src" {
		t.Errorf("the server got %+v", req)
	}
	res, err = f.c.Exec(ctx, "alice", client.ExecRequest{Argv: []string{"cat"}, Stdin: "piped\n"})
	if err != nil || res.Stdout != "piped\n" {
		t.Fatalf("stdin: %+v %v", res, err)
	}
	res, err = f.c.Exec(ctx, "alice", client.ExecRequest{Command: "echo $HOME"})
	if err != nil || res.Stdout != "sh -c echo $HOME\n" {
		t.Fatalf("command: %+v %v", res, err)
	}
}

func TestExecStream(t *testing.T) {
	f := newFixture(t)
	f.be.ExecHook = func(ctx context.Context, key sandkeep.Key, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
		_, _ = io.WriteString(req.Stdout, "one ")
		_, _ = io.WriteString(req.Stderr, "E")
		_, _ = io.WriteString(req.Stdout, "two\xff") // not UTF-8: travels as bytes
		return &sandkeep.ExecResult{ExitCode: 1}, nil
	}
	var out, errOut bytes.Buffer
	res, err := f.c.ExecStream(context.Background(), "alice", client.ExecRequest{Argv: []string{"x"}}, &out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "one two\xff" || errOut.String() != "E" || res.ExitCode != 1 || res.Stdout != "" {
		t.Errorf("stdout %q stderr %q result %+v", out.String(), errOut.String(), res)
	}
	// A failure after the command started ends the stream with an error, with its code.
	f.be.ExecHook = func(ctx context.Context, key sandkeep.Key, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
		_, _ = io.WriteString(req.Stdout, "partial")
		return nil, fault.New(fault.AgentProtocol, "run it again", "the report was cut off")
	}
	out.Reset()
	_, err = f.c.ExecStream(context.Background(), "alice", client.ExecRequest{Argv: []string{"x"}}, &out, nil)
	if sandkeep.CodeOf(err) != fault.AgentProtocol || out.String() != "partial" {
		t.Errorf("error %v, stdout %q", err, out.String())
	}
}

// A caller that cancels its ctx cancels the command on the server.
func TestExecStreamCancel(t *testing.T) {
	f := newFixture(t)
	started, cancelled := make(chan struct{}), make(chan struct{})
	f.be.ExecHook = func(ctx context.Context, key sandkeep.Key, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
		_, _ = io.WriteString(req.Stdout, "running\n")
		close(started)
		<-ctx.Done()
		close(cancelled)
		return &sandkeep.ExecResult{}, ctx.Err()
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := f.c.ExecStream(ctx, "alice", client.ExecRequest{Argv: []string{"x"}}, io.Discard, io.Discard)
		errc <- err
	}()
	wait(t, started)
	cancel()
	wait(t, cancelled)
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("ExecStream returned %v", err)
	}
}

func wait(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("timed out")
	}
}

func TestErrorsKeepTheirCode(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.c.Sandbox(ctx, "nobody")
	var se *sandkeep.Error
	var ae *client.APIError
	if !errors.As(err, &se) || se.Code != fault.NotFound || se.Message != `no sandbox for user "nobody"` || se.Hint == "" {
		t.Fatalf("error %#v", err)
	}
	if !errors.As(err, &ae) || ae.Status != http.StatusNotFound || !strings.HasPrefix(ae.RequestID, "req_") {
		t.Errorf("APIError %+v", ae)
	}
	if _, err := f.c.Exec(ctx, "a\x01b", client.ExecRequest{Argv: []string{"x"}}); sandkeep.CodeOf(err) != fault.InvalidIdentity {
		t.Errorf("control character in user: %v", err)
	}
	bad, _ := client.New(f.url, "skt_not-a-real-token")
	if _, err := bad.Sandboxes(ctx); sandkeep.CodeOf(err) != fault.Unauthenticated {
		t.Errorf("bad token: %v", err)
	}
	readOnly, _ := f.tokens.Add("acme", api.ScopeRead)
	ro, _ := client.New(f.url, readOnly)
	if _, err := ro.Exec(ctx, "alice", client.ExecRequest{Argv: []string{"x"}}); sandkeep.CodeOf(err) != fault.Forbidden {
		t.Errorf("read-only token: %v", err)
	}
	if _, err := f.c.Run(ctx, "no-such-run"); sandkeep.CodeOf(err) != fault.RunNotFound {
		t.Errorf("run: %v", err)
	}
}

func TestRetryAfter(t *testing.T) {
	be, tokens := apitest.NewBackend(t.TempDir()), apitest.NewTokens()
	srv, _ := api.New(api.Config{Backend: be, Tokens: tokens, Limits: api.Limits{RequestsPerSecond: 0.2, Burst: 1}})
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	tok, _ := tokens.Add("acme", api.ScopeRead)
	c, _ := client.New(ts.URL, tok)
	if _, err := c.Sandboxes(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err := c.Sandboxes(context.Background())
	var ae *client.APIError
	if !errors.As(err, &ae) || sandkeep.CodeOf(err) != fault.RateLimited || ae.RetryAfter != 5*time.Second {
		t.Fatalf("error %v (%+v)", err, ae)
	}
}

func TestNonJSONErrorsGetACode(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "<html>bad gateway</html>", http.StatusBadGateway)
	}))
	defer ts.Close()
	c, _ := client.New(ts.URL, "t")
	_, err := c.Sandboxes(context.Background())
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 502 || sandkeep.CodeOf(err) != fault.Internal || !strings.Contains(err.Error(), "bad gateway") {
		t.Errorf("error %v", err)
	}
}

func TestFiles(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	data := bytes.Repeat([]byte{0, 1, 2, 0xff, '\n'}, 1000)
	for _, p := range []string{"plain.bin", "dir/with space/and%percent#hash?q.txt", "/workspace/abs/x", "ünï/cödé"} {
		n, err := f.c.Upload(ctx, "alice", p, bytes.NewReader(data), 0)
		if err != nil || n != int64(len(data)) {
			t.Fatalf("upload %q: %d %v", p, n, err)
		}
		var got bytes.Buffer
		if n, err := f.c.Download(ctx, "alice", p, &got); err != nil || n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
			t.Fatalf("download %q: %d %v", p, n, err)
		}
	}
	if _, err := f.c.Upload(ctx, "alice", "run.sh", strings.NewReader("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Streamed from a reader of unknown length, and empty.
	pr, pw := io.Pipe()
	go func() { _, _ = pw.Write([]byte("piped")); pw.Close() }()
	if n, err := f.c.Upload(ctx, "alice", "piped", pr, 0); err != nil || n != 5 {
		t.Fatalf("piped upload: %d %v", n, err)
	}
	if n, err := f.c.Upload(ctx, "alice", "empty", strings.NewReader(""), 0); err != nil || n != 0 {
		t.Fatalf("empty upload: %d %v", n, err)
	}

	entries, err := f.c.List(ctx, "alice", "")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name+" "+e.Type+" "+e.Mode)
	}
	want := []string{"abs dir 0755", "dir dir 0755", "empty file 0644", "piped file 0644", "plain.bin file 0644", "run.sh file 0755", "ünï dir 0755"}
	if !slices.Equal(names, want) {
		t.Errorf("listing %q, want %q", names, want)
	}

	for _, p := range []string{"..", "../x", "a/../../x", "."} {
		if _, err := f.c.Upload(ctx, "alice", p, strings.NewReader("x"), 0); sandkeep.CodeOf(err) == "" {
			t.Errorf("upload to %q: %v", p, err)
		}
	}
	if _, err := f.c.Download(ctx, "alice", "dir", io.Discard); sandkeep.CodeOf(err) != fault.FileType {
		t.Errorf("Download of a directory: %v", err)
	}
	if err := f.c.DownloadTar(ctx, "alice", "plain.bin", io.Discard); sandkeep.CodeOf(err) != fault.FileType {
		t.Errorf("DownloadTar of a file: %v", err)
	}
	if _, err := f.c.Download(ctx, "alice", "missing", io.Discard); sandkeep.CodeOf(err) != fault.FileNotFound {
		t.Errorf("missing file: %v", err)
	}
}

func TestTar(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	for _, e := range []struct{ name, body string }{{"a/b/c.txt", "c"}, {"a/d.txt", "dd"}, {"top", ""}} {
		_ = tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg})
		_, _ = io.WriteString(tw, e.body)
	}
	tw.Close()
	sum, err := f.c.UploadTar(ctx, "alice", "tree", &in)
	if err != nil || sum.Files != 3 || sum.Bytes != 3 {
		t.Fatalf("UploadTar: %+v %v", sum, err)
	}
	var out bytes.Buffer
	if err := f.c.DownloadTar(ctx, "alice", "tree", &out); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&out)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if h.Typeflag == tar.TypeReg {
			got[h.Name] = string(b)
		}
	}
	if got["a/b/c.txt"] != "c" || got["a/d.txt"] != "dd" || len(got) != 3 {
		t.Errorf("tar entries %v", got)
	}
}

func TestSandboxesStopRemove(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, u := range []string{"bob", "alice"} {
		if _, err := f.c.Exec(ctx, u, client.ExecRequest{Argv: []string{"true"}}); err != nil {
			t.Fatal(err)
		}
	}
	boxes, err := f.c.Sandboxes(ctx)
	if err != nil || len(boxes) != 2 || boxes[0].User != "alice" || boxes[1].State != "running" {
		t.Fatalf("sandboxes %+v %v", boxes, err)
	}
	if err := f.c.Stop(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if sb, err := f.c.Sandbox(ctx, "alice"); err != nil || sb.State != "exited" {
		t.Errorf("after stop: %+v %v", sb, err)
	}
	if err := f.c.Remove(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.c.Sandbox(ctx, "alice"); sandkeep.CodeOf(err) != fault.NotFound {
		t.Errorf("after remove: %v", err)
	}
	if err := f.c.Remove(ctx, "alice"); sandkeep.CodeOf(err) != fault.NotFound {
		t.Errorf("remove again: %v", err)
	}
}

func TestRunsAndEvents(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	res, err := f.c.Exec(ctx, "alice", client.ExecRequest{Argv: []string{"true"}, RequestID: "trace-1"})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := f.c.Runs(ctx, client.RunFilter{User: "alice", Status: store.StatusSucceeded, Limit: 10})
	if err != nil || len(runs) != 1 {
		t.Fatalf("runs %+v %v", runs, err)
	}
	run, err := f.c.Run(ctx, runs[0].ID)
	if err != nil || run.ID != runs[0].ID {
		t.Fatalf("run %+v %v", run, err)
	}
	evs, err := f.c.Events(ctx, run.ID, 0)
	if err != nil || len(evs) < 2 || evs[len(evs)-1].Name != "exec_finished" || evs[0].RequestID != res.RequestID {
		t.Fatalf("events %+v %v", evs, err)
	}
	if later, err := f.c.Events(ctx, run.ID, evs[0].Seq); err != nil || len(later) != len(evs)-1 {
		t.Errorf("events after %d: %d %v", evs[0].Seq, len(later), err)
	}

	// Follow a running run to its end.
	live := f.be.AddRun(store.Run{Tenant: "acme", User: "bob", Trust: store.TrustTrusted, Admission: store.AdmissionAdmitted})
	f.be.AppendEvent(store.Event{RunID: live.ID, Name: "exec_started", Payload: []byte(`{"command":"a"}`)})
	var seen []string
	err = f.c.FollowEvents(ctx, live.ID, 0, func(e client.Event) error {
		seen = append(seen, e.Name)
		if len(seen) == 1 {
			f.be.AppendEvent(store.Event{RunID: live.ID, Name: "exec_finished", Payload: []byte(`{"exit_code":0}`)})
			f.be.FinishRun(live.ID, store.StatusSucceeded)
		}
		return nil
	})
	if err != nil || !slices.Equal(seen, []string{"exec_started", "exec_finished"}) {
		t.Errorf("followed %v, %v", seen, err)
	}
	stop := errors.New("enough")
	if err := f.c.FollowEvents(ctx, live.ID, 0, func(client.Event) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("fn's error: %v", err)
	}
}

// The SDK's own result types carry exactly the fields the server sends.
func TestTypesMatchTheServer(t *testing.T) {
	for _, tc := range []struct {
		sdk, server reflect.Type
		extra       []string
	}{
		{reflect.TypeFor[client.ExecResult](), reflect.TypeFor[sandkeep.ExecResult](), []string{"request_id"}},
		{reflect.TypeFor[client.SandboxRef](), reflect.TypeFor[sandkeep.SandboxRef](), nil},
		{reflect.TypeFor[client.Sandbox](), reflect.TypeFor[sandkeep.Sandbox](), nil},
	} {
		got, want := tags(tc.sdk), append(tags(tc.server), tc.extra...)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%v has JSON fields %v, the server's %v has %v", tc.sdk, got, tc.server, want)
		}
	}
}

func tags(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		out = append(out, t.Field(i).Tag.Get("json"))
	}
	return out
}

func TestNewRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "localhost:7878", "ftp://x", "http://"} {
		if _, err := client.New(u, "t"); err == nil {
			t.Errorf("New(%q) accepted it", u)
		}
	}
}
