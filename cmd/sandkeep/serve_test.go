package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/sqlite"
)

// These tests run a real `sandkeep serve` against the real engine, with its own state home, and talk to it as a
// client would: the Go SDK, plain HTTP, and the tokens the CLI prints.

// transportEnv passes the test's SANDKEEP_TRANSPORT (which cleanEnv drops) on to the server, so that the suite
// can be run once per transport.
func transportEnv() []string {
	if v := os.Getenv("SANDKEEP_TRANSPORT"); v != "" {
		return []string{"SANDKEEP_TRANSPORT=" + v}
	}
	return nil
}

// lineLog is what a process wrote on stderr, one line at a time, and a way to wait for a line.
type lineLog struct {
	mu      sync.Mutex
	text    strings.Builder
	changed chan struct{} // closed and replaced on every line
}

func newLineLog() *lineLog { return &lineLog{changed: make(chan struct{})} }

func (l *lineLog) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.text.WriteString(line)
	l.text.WriteByte('\n')
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *lineLog) snapshot() (string, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.text.String(), l.changed
}

func (l *lineLog) String() string {
	s, _ := l.snapshot()
	return s
}

// server is one `sandkeep serve` process.
type server struct {
	c      *cli
	cmd    *exec.Cmd
	url    string   // http://127.0.0.1:PORT
	log    *lineLog // its stderr: its own lines and the JSON access log
	exited chan struct{}
	err    error        // of Wait, valid once exited is closed
	hc     *http.Client // for raw requests
}

// startServer starts `sandkeep serve --listen 127.0.0.1:0 args...` and waits until it says where it listens.
// The port is the one the kernel chose, so parallel tests never race for one. The server is stopped (SIGTERM,
// then killed) when the test ends, and its stderr is logged when the test failed.
func (c *cli) startServer(t *testing.T, args ...string) *server {
	t.Helper()
	return c.startServerEnv(t, nil, args...)
}

// startServerEnv is startServer with extraEnv added to the server's environment.
func (c *cli) startServerEnv(t *testing.T, extraEnv []string, args ...string) *server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), processBound)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	s := &server{c: c, log: newLineLog(), exited: make(chan struct{}), hc: &http.Client{Transport: tr}}
	env := transportEnv()
	if c.kc != nil { // serve keeps the pods' agent channel (a port of its own unless extraEnv names one)
		env = append(env, kube.EnvChannelListen+"="+c.kc.Options(c.ns).ChannelListen)
	}
	s.cmd = c.command(ctx, append(env, extraEnv...), append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() {
		defer cancel()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			s.log.add(sc.Text())
		}
		_, _ = io.Copy(io.Discard, stderr) // a line past the scanner's bound: keep the pipe drained
		s.err = s.cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		if !s.done() {
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.exited:
			case <-time.After(time.Minute):
				_ = s.cmd.Process.Kill()
				<-s.exited
				t.Errorf("sandkeep serve did not stop within a minute of SIGTERM")
			}
		}
		if t.Failed() {
			t.Logf("sandkeep serve stderr:\n%s", s.log)
		}
	})
	m := s.waitFor(t, `sandkeep: serving (http://127\.0\.0\.1:\d+) \(API /v1, MCP /mcp\)`)
	s.url = m[1]
	return s
}

func (s *server) done() bool {
	select {
	case <-s.exited:
		return true
	default:
		return false
	}
}

// waitFor waits until the server's stderr matches pattern and returns the submatches; the server exiting
// first, or processBound passing, fails the test.
func (s *server) waitFor(t *testing.T, pattern string) []string {
	t.Helper()
	re := regexp.MustCompile(pattern)
	deadline := time.After(processBound)
	for {
		text, changed := s.log.snapshot()
		if m := re.FindStringSubmatch(text); m != nil {
			return m
		}
		select {
		case <-changed:
		case <-s.exited:
			if m := re.FindStringSubmatch(s.log.String()); m != nil {
				return m
			}
			t.Fatalf("sandkeep serve exited (%v) before its stderr matched %q:\n%s", s.err, pattern, s.log)
		case <-deadline:
			t.Fatalf("sandkeep serve: stderr did not match %q within %v:\n%s", pattern, processBound, s.log)
		}
	}
}

// client returns an SDK client of the server with token. Its connections are closed when the test ends.
func (s *server) client(t *testing.T, token string) *client.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	cl, err := client.New(s.url, token, client.WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// httpAnswer is a whole HTTP answer.
type httpAnswer struct {
	status int
	header http.Header
	body   string
}

// raw sends one request with token ("" sends no Authorization) and reads the whole answer.
func (s *server) raw(t *testing.T, method, path, token string, body io.Reader, header ...string) httpAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), processBound)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read the answer: %v", method, path, err)
	}
	return httpAnswer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// createToken makes a token with the real CLI, against the same store the server reads.
func (c *cli) createToken(t *testing.T, tenant, name, scopes string) tokenCreated {
	t.Helper()
	args := []string{"token", "create", "--tenant", tenant, "--name", name, "--json"}
	if scopes != "" {
		args = append(args, "--scopes", scopes)
	}
	r := c.run(t, args...).want(t, 0)
	var tok tokenCreated
	decodeOne(t, r.stdout, &tok, tokenCreatedFields)
	return tok
}

// bounded is a context for one SDK call (or a few): it turns a hang into a failure.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), processBound)
	t.Cleanup(cancel)
	return ctx
}

// wantAPIError checks that err is the server's answer with status and code, and returns it.
func wantAPIError(t *testing.T, err error, status int, code fault.Code) *client.APIError {
	t.Helper()
	var ae *client.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("error %v (%T), want an API error %d %s", err, err, status, code)
	}
	if ae.Status != status || ae.Err.Code != code || ae.Err.Message == "" || ae.Err.Hint == "" {
		t.Fatalf("API error %d %s (%q, hint %q), want %d %s with a message and a hint",
			ae.Status, ae.Err.Code, ae.Err.Message, ae.Err.Hint, status, code)
	}
	if sandkeep.CodeOf(err) != code {
		t.Errorf("sandkeep.CodeOf(%v) = %q, want %s", err, sandkeep.CodeOf(err), code)
	}
	return ae
}

// touch creates name in the host directory of (tenant, user)'s /workspace: the commands below wait for it.
func (c *cli) touch(t *testing.T, tenant, user, name string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(c.workspace(t, tenant, user), name), nil, 0o644); err != nil {
		t.Fatalf("touch %s: %v", name, err)
	}
}

// waitCmd is a shell line that waits for /workspace/name to exist.
func waitCmd(name string) string {
	return "while [ ! -e /workspace/" + name + " ]; do sleep 0.05; done"
}

// chunk is one piece of streamed output as the SDK delivered it.
type chunk struct{ stream, data string }

// streamLog records what ExecStream writes, in order, and calls react after each write (on ExecStream's
// goroutine, so react may act on the command while it runs).
type streamLog struct {
	mu     sync.Mutex
	chunks []chunk
	react  func(stdout, stderr string)
}

func (l *streamLog) writer(stream string) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		l.mu.Lock()
		l.chunks = append(l.chunks, chunk{stream, string(p)})
		out, errs := l.textLocked()
		react := l.react
		l.mu.Unlock()
		if react != nil {
			react(out, errs)
		}
		return len(p), nil
	})
}

func (l *streamLog) textLocked() (stdout, stderr string) {
	var o, e strings.Builder
	for _, c := range l.chunks {
		if c.stream == "stdout" {
			o.WriteString(c.data)
		} else {
			e.WriteString(c.data)
		}
	}
	return o.String(), e.String()
}

// merged returns the chunks with neighbours of the same stream joined: how the output interleaved.
func (l *streamLog) merged() []chunk {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []chunk
	for _, c := range l.chunks {
		if n := len(out); n > 0 && out[n-1].stream == c.stream {
			out[n-1].data += c.data
			continue
		}
		out = append(out, c)
	}
	return out
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestServeSDK drives the Go SDK against a real server over Docker: commands, streams, files, sandboxes, runs
// and events.
func TestServeSDK(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	s := c.startServer(t)
	tenant := c.ten("acme")
	tok := c.createToken(t, tenant, "sdk", "admin")
	cl := s.client(t, tok.Token)
	var sandboxName, madeID string // the sandbox alice's commands run in; a request id the server made

	uid := "" // the sandbox user's uid, as the exec subtest reads it
	t.Run("exec", func(t *testing.T) {
		res, err := cl.Exec(bounded(t), "alice", client.ExecRequest{
			Command: `echo "hi $FOO"; echo oops >&2; cat; pwd; id -u; exit 3`, Env: map[string]string{"FOO": "bar"},
			Stdin: "from stdin\n", Workdir: "src", RequestID: "sdk-req-1", Timeout: time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(res.Stdout, "\n")
		if len(lines) > 3 {
			uid = sandboxUID(t, lines[3])
		}
		if res.ExitCode != 3 || res.TimedOut || res.Stdout != "hi bar\nfrom stdin\n/workspace/src\n"+uid+"\n" || res.Stderr != "oops\n" {
			t.Errorf("result %+v", res)
		}
		if res.RequestID != "sdk-req-1" || res.Sandbox.Tenant != tenant || res.Sandbox.User != "alice" ||
			res.Sandbox.Driver != c.driverName() || !strings.HasPrefix(res.Sandbox.Name, "sandkeep-u-") {
			t.Errorf("request id and sandbox of the result: %q, %+v", res.RequestID, res.Sandbox)
		}
		if want := os.Getenv("SANDKEEP_TRANSPORT"); want != "" && want != "auto" && res.Transport != want {
			t.Errorf("transport %q, want %q", res.Transport, want)
		}
		sandboxName = res.Sandbox.Name
		// The access log names the request, its tenant and its answer.
		s.waitFor(t, `\{[^\n]*"route":"POST /v1/sandboxes/\{user\}/exec"[^\n]*"status":200[^\n]*"request_id":"sdk-req-1"[^\n]*"tenant":"`+regexp.QuoteMeta(tenant)+`"`)

		// Without a request id the server makes one and returns it.
		res, err = cl.Exec(bounded(t), "alice", client.ExecRequest{Argv: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 || !regexp.MustCompile(`^req_[0-9a-f]{24}$`).MatchString(res.RequestID) {
			t.Errorf("result %+v: want exit 0 and a request id made by the server", res)
		}
		madeID = res.RequestID
		// A command that runs past its timeout is a result too.
		res, err = cl.Exec(bounded(t), "alice", client.ExecRequest{Argv: []string{"sleep", "60"}, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if !res.TimedOut || res.ExitCode != 124 {
			t.Errorf("timed out command: %+v", res)
		}
		// A request the server refuses is a typed error.
		_, err = cl.Exec(bounded(t), "alice", client.ExecRequest{})
		wantAPIError(t, err, http.StatusBadRequest, fault.RequestInvalid)
	})

	t.Run("stream", func(t *testing.T) {
		// Each line waits for a file the test creates only once it has received the line before it: the order
		// is fixed, and each chunk provably arrived while the command was still running.
		log := &streamLog{}
		var released []string
		log.react = func(stdout, stderr string) {
			if stdout == "one\n" && len(released) == 0 {
				released = append(released, "go1")
				c.touch(t, tenant, "streamer", "go1")
			}
			if stderr == "two\n" && len(released) == 1 {
				released = append(released, "go2")
				c.touch(t, tenant, "streamer", "go2")
			}
		}
		res, err := cl.ExecStream(bounded(t), "streamer", client.ExecRequest{
			Command:   "rm -f /workspace/go1 /workspace/go2; echo one; " + waitCmd("go1") + "; echo two >&2; " + waitCmd("go2") + "; echo three",
			RequestID: "sdk-stream-1",
		}, log.writer("stdout"), log.writer("stderr"))
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 || res.Stdout != "" || res.Stderr != "" || res.RequestID != "sdk-stream-1" {
			t.Errorf("streamed result %+v: want exit 0, no collected output, the request id", res)
		}
		want := []chunk{{"stdout", "one\n"}, {"stderr", "two\n"}, {"stdout", "three\n"}}
		if got := log.merged(); !slices.Equal(got, want) {
			t.Errorf("streamed output %q, want %q", got, want)
		}
		if len(released) != 2 {
			t.Errorf("the command was released %v", released)
		}
	})

	t.Run("files", func(t *testing.T) {
		ctx := bounded(t)
		// On kubernetes the workspace is the pod's claim: every operation below runs in the pod, through its
		// agent (sandkeep-agent fs), with the same answers as on Docker.
		// Binary: every byte value, then random bytes, in a directory that does not exist yet.
		data := make([]byte, 3<<20)
		for i := range 256 {
			data[i] = byte(i)
		}
		_, _ = rand.Read(data[256:])
		n, err := cl.Upload(ctx, "alice", "bin/deep/data.bin", bytes.NewReader(data), 0o640)
		if err != nil || n != int64(len(data)) {
			t.Fatalf("upload: %d bytes, %v", n, err)
		}
		var got bytes.Buffer
		if n, err := cl.Download(ctx, "alice", "bin/deep/data.bin", &got); err != nil || n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
			t.Fatalf("download: %d bytes, %v; identical: %v", n, err, bytes.Equal(got.Bytes(), data))
		}
		// The command sees it whole, owned by the sandbox user, with its mode.
		res, err := cl.Exec(ctx, "alice", client.ExecRequest{Command: "stat -c '%u %g %a %s' bin/deep/data.bin; stat -c '%u' bin bin/deep; head -c 256 bin/deep/data.bin | od -An -tx1 | head -1"})
		if err != nil {
			t.Fatal(err)
		}
		wantOut := uid + " " + uid + " 640 3145728\n" + uid + "\n" + uid + "\n 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f\n"
		if res.ExitCode != 0 || res.Stdout != wantOut {
			t.Errorf("the uploaded file seen from the sandbox: %+v\nwant stdout %q", res, wantOut)
		}

		// Empty file.
		if n, err := cl.Upload(ctx, "alice", "empty", strings.NewReader(""), 0); err != nil || n != 0 {
			t.Fatalf("upload empty: %d, %v", n, err)
		}
		got.Reset()
		if n, err := cl.Download(ctx, "alice", "empty", &got); err != nil || n != 0 || got.Len() != 0 {
			t.Errorf("download empty: %d bytes, %v", n, err)
		}

		// A written file comes back byte for byte.
		res, err = cl.Exec(ctx, "alice", client.ExecRequest{Command: "printf 'made\\000inside' > made.bin"})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %+v, %v", res, err)
		}
		got.Reset()
		if _, err := cl.Download(ctx, "alice", "made.bin", &got); err != nil || got.String() != "made\x00inside" {
			t.Errorf("download of a file the command wrote: %q, %v", got.String(), err)
		}

		// A tar tree with nested directories.
		tree := map[string]string{ // name -> content; "" with a trailing slash is a directory
			"a/":                 "",
			"a/top.txt":          "top\n",
			"a/b/":               "",
			"a/b/c/":             "",
			"a/b/c/deep.bin":     "\x00\xff\x10binary",
			"a/b/mid.txt":        "mid\n",
			"a/empty-dir/":       "",
			"a/b/c/d/e/leaf.txt": "leaf\n",
		}
		sum, err := cl.UploadTar(ctx, "alice", "tree", bytes.NewReader(makeTar(t, tree)))
		if err != nil {
			t.Fatalf("upload tar: %v", err)
		}
		t.Logf("tar upload: %+v", sum)
		res, err = cl.Exec(ctx, "alice", client.ExecRequest{Command: "cd tree && find . | sort && cat a/b/c/d/e/leaf.txt && stat -c '%u' a/b/c/d/e/leaf.txt a/b/c/d"})
		if err != nil {
			t.Fatal(err)
		}
		wantFind := ".\n./a\n./a/b\n./a/b/c\n./a/b/c/d\n./a/b/c/d/e\n./a/b/c/d/e/leaf.txt\n./a/b/c/deep.bin\n./a/b/mid.txt\n./a/empty-dir\n./a/top.txt\nleaf\n" + uid + "\n" + uid + "\n"
		if res.ExitCode != 0 || res.Stdout != wantFind {
			t.Errorf("the extracted tree seen from the sandbox: %+v\nwant stdout %q", res, wantFind)
		}
		var tb bytes.Buffer
		if err := cl.DownloadTar(ctx, "alice", "tree", &tb); err != nil {
			t.Fatalf("download tar: %v", err)
		}
		back := readTar(t, tb.Bytes())
		// The download lists every directory, including those the upload implied (a/b/c/d, a/b/c/d/e).
		wantBack := maps.Clone(tree)
		wantBack["a/b/c/d/"], wantBack["a/b/c/d/e/"] = "", ""
		if !maps.Equal(back, wantBack) {
			t.Errorf("tar round trip:\n got %q\nwant %q", back, wantBack)
		}

		entries, err := cl.List(ctx, "alice", "tree/a")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name+":"+e.Type)
		}
		if want := []string{"b:dir", "empty-dir:dir", "top.txt:file"}; !slices.Equal(names, want) {
			t.Errorf("list tree/a: %v, want %v", names, want)
		}

		_, err = cl.Download(ctx, "alice", "no/such/file", io.Discard)
		wantAPIError(t, err, http.StatusNotFound, fault.FileNotFound)
		_, err = cl.Download(ctx, "alice", "../../etc/passwd", io.Discard)
		wantAPIError(t, err, http.StatusBadRequest, fault.InvalidPath)
	})

	t.Run("runs and events", func(t *testing.T) {
		ctx := bounded(t)
		runs, err := cl.Runs(ctx, client.RunFilter{User: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		// Each command of alice is a run of her own; find those of the two request ids by their events.
		byRequest := map[string]string{} // request id -> run id
		for _, r := range runs {
			if r.Tenant != tenant || r.User != "alice" {
				t.Errorf("runs of user alice include %+v", r)
			}
			evs, err := cl.Events(ctx, r.ID, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) > 0 {
				byRequest[evs[0].RequestID] = r.ID
			}
		}
		for _, reqID := range []string{"sdk-req-1", madeID} {
			id, ok := byRequest[reqID]
			if !ok {
				t.Errorf("no run of alice has the events of request %s (%d runs)", reqID, len(runs))
				continue
			}
			run, err := cl.Run(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if run.ID != id || run.Status != store.StatusSucceeded || run.Admission != store.AdmissionAdmitted ||
				run.Driver != c.driverName() || run.FinishedAt.IsZero() {
				t.Errorf("run of the command with request id %s: %+v", reqID, run)
			}
			evs, err := cl.Events(ctx, id, 0)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range evs {
				names = append(names, e.Name)
				if e.RequestID != reqID || e.RunID != id {
					t.Errorf("event %s of run %s carries request id %q, run %q; want %s", e.Name, id, e.RequestID, e.RunID, reqID)
				}
			}
			if !slices.Contains(names, events.NameExecStarted) || !slices.Contains(names, events.NameExecFinished) {
				t.Errorf("events of the run: %v, want exec_started and exec_finished", names)
			}
			// after= skips what was seen; following a finished run delivers the rest and ends.
			if rest, err := cl.Events(ctx, id, evs[0].Seq); err != nil || len(rest) != len(evs)-1 {
				t.Errorf("events after %d: %d, %v; want %d", evs[0].Seq, len(rest), err, len(evs)-1)
			}
			var followed []string
			err = cl.FollowEvents(ctx, id, 0, func(e client.Event) error {
				followed = append(followed, e.Name)
				return nil
			})
			if err != nil || !slices.Equal(followed, names) {
				t.Errorf("following the finished run: %v, %v; want %v", followed, err, names)
			}
		}
		_, err = cl.Run(ctx, "0190a0a0-0000-7000-8000-000000000000")
		wantAPIError(t, err, http.StatusNotFound, fault.RunNotFound)
	})

	t.Run("sandboxes", func(t *testing.T) {
		ctx := bounded(t)
		boxes, err := cl.Sandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var users []string
		for _, b := range boxes {
			users = append(users, b.User+":"+b.State)
			if b.Tenant != tenant {
				t.Errorf("sandbox of another tenant listed: %+v", b)
			}
		}
		if want := []string{"alice:running", "streamer:running"}; !slices.Equal(users, want) {
			t.Errorf("sandboxes %v, want %v", users, want)
		}
		sb, err := cl.Sandbox(ctx, "alice")
		if err != nil {
			t.Fatal(err)
		}
		if sb.Name != sandboxName || sb.State != "running" || sb.User != "alice" || sb.ID == "" || sb.Image == "" {
			t.Errorf("sandbox alice: %+v (the exec ran in %s)", sb, sandboxName)
		}

		if err := cl.Stop(ctx, "alice"); err != nil {
			t.Fatal(err)
		}
		if sb, err := cl.Sandbox(ctx, "alice"); err != nil || sb.State == "running" {
			t.Errorf("after stop: %+v, %v", sb, err)
		}
		// The next command starts it again, with the workspace as it was.
		res, err := cl.Exec(ctx, "alice", client.ExecRequest{Command: "cat tree/a/top.txt"})
		if err != nil || res.ExitCode != 0 || res.Stdout != "top\n" || res.Sandbox.Name != sandboxName {
			t.Errorf("exec after stop: %+v, %v", res, err)
		}

		if err := cl.Remove(ctx, "alice"); err != nil {
			t.Fatal(err)
		}
		_, err = cl.Sandbox(ctx, "alice")
		wantAPIError(t, err, http.StatusNotFound, fault.NotFound)
		_, err = cl.Download(ctx, "alice", "empty", io.Discard)
		wantAPIError(t, err, http.StatusNotFound, fault.FileNotFound)
		wantAPIError(t, cl.Stop(ctx, "alice"), http.StatusNotFound, fault.NotFound)
		if boxes, err := cl.Sandboxes(ctx); err != nil || len(boxes) != 1 || boxes[0].User != "streamer" {
			t.Errorf("sandboxes after removing alice: %+v, %v", boxes, err)
		}
	})
}

func makeTar(t *testing.T, tree map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range slices.Sorted(maps.Keys(tree)) {
		hdr := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(tree[name])), Typeflag: tar.TypeReg, ModTime: time.Now()}
		if strings.HasSuffix(name, "/") {
			hdr.Mode, hdr.Size, hdr.Typeflag = 0o755, 0, tar.TypeDir
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(tree[name])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// readTar returns a tar's entries as makeTar takes them: directories with a trailing slash.
func readTar(t *testing.T, data []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("the downloaded tar is broken: %v", err)
		}
		name := strings.TrimPrefix(hdr.Name, "./")
		switch hdr.Typeflag {
		case tar.TypeDir:
			out[strings.TrimSuffix(name, "/")+"/"] = ""
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out[name] = string(b)
		default:
			t.Errorf("unexpected tar entry %q of type %c", hdr.Name, hdr.Typeflag)
		}
	}
}

// TestServeDisconnect: a client that goes away mid-command cancels it, and its whole process tree dies.
func TestServeDisconnect(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	s := c.startServer(t)
	tenant := c.ten("acme")
	cl := s.client(t, c.createToken(t, tenant, "sdk", "").Token)

	ctx, cancel := context.WithCancel(bounded(t))
	started := make(chan struct{})
	var once sync.Once
	out := writerFunc(func(p []byte) (int, error) {
		if strings.Contains(string(p), "started") {
			once.Do(func() { close(started) })
		}
		return len(p), nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := cl.ExecStream(ctx, "alice", client.ExecRequest{
			Command: "sleep 301 & sleep 302 & echo started; sleep 303; wait", Timeout: 10 * time.Minute,
		}, out, nil)
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		cancel()
		t.Fatalf("the stream ended before the command started: %v", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("ExecStream after its ctx was cancelled: %v, want context.Canceled", err)
	}

	// The sandbox is still there and usable; within a bound, nothing of the command is left in it.
	const bound = 30 * time.Second
	deadline := time.Now().Add(bound)
	for {
		res, err := cl.Exec(bounded(t), "alice", client.ExecRequest{Argv: []string{"ps", "-o", "pid,args"}})
		if err != nil {
			t.Fatal(err)
		}
		// ps shows its own arguments: an empty or argument-less listing cannot pass for "nothing left".
		if res.ExitCode != 0 || !strings.Contains(res.Stdout, "ps -o pid,args") {
			t.Fatalf("ps: %+v", res)
		}
		if !regexp.MustCompile(`sleep 30[123]`).MatchString(res.Stdout) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after the client went away, the command's processes are still running:\n%s", bound, res.Stdout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestServeIsolation: another tenant's token sees nothing of a tenant's sandboxes, runs, events and files, and
// every answer it gets is the one for an object that does not exist; revoked and expired tokens are refused.
func TestServeIsolation(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	s := c.startServer(t)
	tenantA, tenantB := c.ten("acme"), c.ten("globex")
	tokA := c.createToken(t, tenantA, "a", "admin").Token
	tokB := c.createToken(t, tenantB, "b", "admin").Token
	a := s.client(t, tokA)

	// What B may try on "alice", A's user. Nothing here may create anything for B.
	probes := []struct{ method, path string }{
		{"GET", "/v1/sandboxes"},
		{"GET", "/v1/sandboxes/alice"},
		{"POST", "/v1/sandboxes/alice/stop"},
		{"DELETE", "/v1/sandboxes/alice"},
		{"GET", "/v1/sandboxes/alice/files/secret.txt"},
		{"GET", "/v1/sandboxes/alice/files/d"},
		{"GET", "/v1/sandboxes/alice/files/?list=1"},
		{"GET", "/v1/sandboxes/alice/files/d?list=1"},
		{"GET", "/v1/runs"},
		{"GET", "/v1/runs?user=alice"},
	}
	probe := func() []httpAnswer {
		var out []httpAnswer
		for _, p := range probes {
			out = append(out, s.raw(t, p.method, p.path, tokB, nil))
		}
		return out
	}
	before := probe()

	// A makes a sandbox with a file, a directory and a run.
	res, err := a.Exec(bounded(t), "alice", client.ExecRequest{Command: "echo A-secret > secret.txt; mkdir -p d; echo x > d/x"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("A's exec: %+v, %v", res, err)
	}
	runsA, err := a.Runs(bounded(t), client.RunFilter{})
	if err != nil || len(runsA) != 1 {
		t.Fatalf("A's runs: %+v, %v", runsA, err)
	}
	runA := runsA[0].ID

	// B's answers have not changed by one byte.
	after := probe()
	for i, p := range probes {
		if before[i].status != after[i].status || before[i].body != after[i].body {
			t.Errorf("%s %s with B's token: before A's sandbox existed %d %s; after %d %s",
				p.method, p.path, before[i].status, before[i].body, after[i].status, after[i].body)
		}
		if after[i].status/100 == 2 && !regexp.MustCompile(`^\{"(sandboxes|runs)":\[\]\}\n$`).MatchString(after[i].body) {
			t.Errorf("%s %s with B's token shows something: %s", p.method, p.path, after[i].body)
		}
	}
	// A's run is, for B, exactly a run that does not exist.
	missing, err := store.NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"", "/events", "/events?follow=1"} {
		got := s.raw(t, "GET", "/v1/runs/"+runA+suffix, tokB, nil)
		none := s.raw(t, "GET", "/v1/runs/"+missing+suffix, tokB, nil)
		if got.status != http.StatusNotFound || got.body != strings.ReplaceAll(none.body, missing, runA) ||
			!strings.Contains(got.body, `"code":"RUN_NOT_FOUND"`) {
			t.Errorf("GET /v1/runs/<A's run>%s with B's token: %d %s; for a missing run: %d %s",
				suffix, got.status, got.body, none.status, none.body)
		}
	}
	if got := s.raw(t, "GET", "/v1/runs/"+runA, tokA, nil); got.status != http.StatusOK {
		t.Errorf("A cannot read its own run: %d %s", got.status, got.body)
	}
	// Attaching a command to A's run is, for B, attaching it to a run that does not exist.
	attached := s.raw(t, "POST", "/v1/sandboxes/alice/exec", tokB, strings.NewReader(`{"command":"true","run_id":"`+runA+`"}`))
	unknown := s.raw(t, "POST", "/v1/sandboxes/alice/exec", tokB, strings.NewReader(`{"command":"true","run_id":"`+missing+`"}`))
	if attached.status != http.StatusNotFound || !strings.Contains(attached.body, `"code":"RUN_NOT_FOUND"`) ||
		stripRequestID(attached.body) != strings.ReplaceAll(stripRequestID(unknown.body), missing, runA) {
		t.Errorf("exec with A's run_id and B's token: %d %s; with a missing run: %d %s",
			attached.status, attached.body, unknown.status, unknown.body)
	}

	// What B writes and runs for "alice" lands in B's own sandbox, never in A's.
	b := s.client(t, tokB)
	if _, err := b.Upload(bounded(t), "alice", "secret.txt", strings.NewReader("B-data\n"), 0); err != nil {
		t.Fatal(err)
	}
	res, err = b.Exec(bounded(t), "alice", client.ExecRequest{Command: "cat secret.txt; ls -A"})
	if err != nil || res.Stdout != "B-data\nsecret.txt\n" {
		t.Errorf("B's command for alice sees %+v, %v", res, err)
	}
	var got bytes.Buffer
	if _, err := a.Download(bounded(t), "alice", "secret.txt", &got); err != nil || got.String() != "A-secret\n" {
		t.Errorf("A's file after B wrote its own: %q, %v", got.String(), err)
	}
	if sb, err := a.Sandbox(bounded(t), "alice"); err != nil || sb.State != "running" || sb.Name == res.Sandbox.Name {
		t.Errorf("A's sandbox %+v, %v; B's command ran in %s", sb, err, res.Sandbox.Name)
	}

	// Refused tokens: all get the same answer as a token that never existed.
	bogus := s.raw(t, "GET", "/v1/sandboxes", "skt_"+strings.Repeat("A", 43), nil)
	if bogus.status != http.StatusUnauthorized || !strings.Contains(bogus.body, `"code":"UNAUTHENTICATED"`) ||
		bogus.header.Get("WWW-Authenticate") == "" {
		t.Fatalf("unknown token: %d %v %s", bogus.status, bogus.header, bogus.body)
	}
	if none := s.raw(t, "GET", "/v1/sandboxes", "", nil); none.status != http.StatusUnauthorized || none.body != bogus.body {
		t.Errorf("no token: %d %s, want the same as an unknown token", none.status, none.body)
	}

	t.Run("revoked", func(t *testing.T) {
		tok := c.createToken(t, tenantA, "soon-revoked", "read")
		cl := s.client(t, tok.Token)
		if _, err := cl.Sandboxes(bounded(t)); err != nil {
			t.Fatalf("a fresh token: %v", err)
		}
		c.run(t, "token", "revoke", tok.ID).want(t, 0)
		// The same client, likely on the same connection: the very next request is refused.
		_, err := cl.Sandboxes(bounded(t))
		wantAPIError(t, err, http.StatusUnauthorized, fault.Unauthenticated)
		if got := s.raw(t, "GET", "/v1/sandboxes/alice", tok.Token, nil); got.status != bogus.status || got.body != bogus.body {
			t.Errorf("revoked token: %d %s, want the unknown token's answer", got.status, got.body)
		}
	})

	t.Run("expired", func(t *testing.T) {
		// The CLI refuses lifetimes under a minute; a token created two hours ago that lived one is expired now.
		st, err := sqlite.Open(t.Context(), filepath.Join(c.home, "sandkeep.db"))
		if err != nil {
			t.Fatal(err)
		}
		_, secret, err := auth.Create(t.Context(), st, auth.Spec{Tenant: tenantA, Name: "old", TTL: time.Hour}, time.Now().Add(-2*time.Hour))
		if cerr := st.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := s.raw(t, "GET", "/v1/sandboxes/alice", secret, nil); got.status != bogus.status || got.body != bogus.body {
			t.Errorf("expired token: %d %s, want the unknown token's answer", got.status, got.body)
		}
	})

	t.Run("wrong scope", func(t *testing.T) {
		cl := s.client(t, c.createToken(t, tenantA, "reader", "read").Token)
		if _, err := cl.Sandbox(bounded(t), "alice"); err != nil {
			t.Errorf("read scope cannot read: %v", err)
		}
		_, err := cl.Exec(bounded(t), "alice", client.ExecRequest{Command: "touch /workspace/pwned"})
		wantAPIError(t, err, http.StatusForbidden, fault.Forbidden)
		_, err = cl.Upload(bounded(t), "alice", "pwned", strings.NewReader("x"), 0)
		wantAPIError(t, err, http.StatusForbidden, fault.Forbidden)
		wantAPIError(t, cl.Remove(bounded(t), "alice"), http.StatusForbidden, fault.Forbidden)
		res, err := a.Exec(bounded(t), "alice", client.ExecRequest{Command: "ls /workspace"})
		if err != nil || res.Stdout != "d\nsecret.txt\n" {
			t.Errorf("A's workspace after the refused requests: %+v, %v", res, err)
		}
	})
}

// TestServeShutdown: SIGTERM while a command runs: the command's client still gets its whole result, new
// commands are refused meanwhile, the server exits 0, and the run is recorded as succeeded.
func TestServeShutdown(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	s := c.startServer(t)
	tenant := c.ten("acme")
	tok := c.createToken(t, tenant, "sdk", "").Token
	cl := s.client(t, tok)
	ws := c.workspace(t, tenant, "alice")

	type outcome struct {
		res *client.ExecResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := cl.Exec(context.Background(), "alice", client.ExecRequest{
			Command: "echo started > /workspace/started; " + waitCmd("release") + "; echo finished",
		})
		done <- outcome{res, err}
	}()
	// Wait until the command runs; it cannot end before the release below.
	deadline := time.Now().Add(processBound)
	for {
		if _, err := os.Stat(filepath.Join(ws, "started")); err == nil {
			break
		}
		select {
		case o := <-done:
			t.Fatalf("the command ended before it was released: %+v, %v", o.res, o.err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the command did not start")
		}
	}

	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	s.waitFor(t, `sandkeep: draining`)
	// Draining: a new command is refused at once, and /readyz says so; the running one goes on.
	_, err := s.client(t, tok).Exec(bounded(t), "bob", client.ExecRequest{Command: "echo should-not-run"})
	ae := wantAPIError(t, err, http.StatusServiceUnavailable, fault.ShuttingDown)
	t.Logf("refused while draining: %v", ae)
	if r := s.raw(t, "GET", "/readyz", "", nil); r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "SHUTTING_DOWN") {
		t.Errorf("/readyz while draining: %d %s", r.status, r.body)
	}
	select {
	case o := <-done:
		t.Fatalf("the running command ended before it was released: %+v, %v", o.res, o.err)
	case <-s.exited:
		t.Fatalf("the server exited while a command was running: %v", s.err)
	default:
	}

	c.touch(t, tenant, "alice", "release")
	var o outcome
	select {
	case o = <-done:
	case <-time.After(processBound):
		t.Fatal("the running command's client got no answer")
	}
	if o.err != nil || o.res.ExitCode != 0 || o.res.Stdout != "finished\n" {
		t.Errorf("the command that ran across SIGTERM: %+v, %v; want exit 0 and its stdout", o.res, o.err)
	}
	select {
	case <-s.exited:
	case <-time.After(processBound):
		t.Fatal("the server did not exit after its last command ended")
	}
	if s.err != nil {
		t.Errorf("sandkeep serve exited with %v after SIGTERM, want 0", s.err)
	}
	s.waitFor(t, `sandkeep: stopped`)

	r := c.run(t, "runs", "--json", "--tenant", tenant).want(t, 0)
	var runs []store.Run
	decodeJSON(t, r.stdout, &runs)
	if len(runs) != 1 || runs[0].User != "alice" || runs[0].Status != store.StatusSucceeded || runs[0].FinishedAt.IsZero() {
		t.Errorf("runs recorded: %+v; want alice's command only, succeeded (the refused one never ran)", runs)
	}
}

// TestServeLimits: a tenant at its max_concurrent_execs gets 429 RATE_LIMITED with Retry-After at once; other
// tenants are not affected.
func TestServeLimits(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	limited, free := c.ten("acme"), c.ten("globex")
	config := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	if err := os.WriteFile(config, []byte("tenants:\n  "+limited+":\n    max_concurrent_execs: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := c.startServer(t, "--config", config)
	cl := s.client(t, c.createToken(t, limited, "sdk", "").Token)
	other := s.client(t, c.createToken(t, free, "sdk", "").Token)

	started := make(chan struct{})
	var once sync.Once
	out := writerFunc(func(p []byte) (int, error) {
		once.Do(func() { close(started) })
		return len(p), nil
	})
	type outcome struct {
		res *client.ExecResult
		err error
	}
	done := make(chan outcome, 1)
	ctx := bounded(t)
	go func() {
		res, err := cl.ExecStream(ctx, "alice", client.ExecRequest{
			Command: "rm -f /workspace/release; echo started; " + waitCmd("release"),
		}, out, nil)
		done <- outcome{res, err}
	}()
	select {
	case <-started:
	case o := <-done:
		t.Fatalf("the first command ended before it was released: %+v, %v", o.res, o.err)
	}

	// The limit counts the tenant's commands over all its users.
	for _, user := range []string{"bob", "alice"} {
		_, err := cl.Exec(bounded(t), user, client.ExecRequest{Command: "true"})
		ae := wantAPIError(t, err, http.StatusTooManyRequests, fault.RateLimited)
		if ae.RetryAfter <= 0 {
			t.Errorf("429 for %s without Retry-After: %+v", user, ae)
		}
	}
	// Another tenant runs meanwhile.
	if res, err := other.Exec(bounded(t), "bob", client.ExecRequest{Command: "echo free"}); err != nil || res.Stdout != "free\n" {
		t.Errorf("another tenant's command while the first is at its limit: %+v, %v", res, err)
	}

	c.touch(t, limited, "alice", "release")
	o := <-done
	if o.err != nil || o.res.ExitCode != 0 {
		t.Fatalf("the first command: %+v, %v", o.res, o.err)
	}
	// Its place is free again.
	if res, err := cl.Exec(bounded(t), "bob", client.ExecRequest{Command: "echo again"}); err != nil || res.Stdout != "again\n" {
		t.Errorf("a command after the first ended: %+v, %v", res, err)
	}
}

// stripRequestID blanks the request id an error body may carry, so two answers can be compared.
func stripRequestID(body string) string {
	return regexp.MustCompile(`req_[0-9a-f]+`).ReplaceAllString(body, "req_")
}

// TestServeSweeps: the server runs the sweeper, so an idle sandbox is stopped without anyone calling sandkeep
// sweep, and the next command starts it again with its workspace.
func TestServeSweeps(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	tenant := c.ten("acme")
	config := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	if err := os.WriteFile(config, []byte("sweep: {interval: 1s, idle_timeout: 2s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := c.startServer(t, "--config", config)
	cl := s.client(t, c.createToken(t, tenant, "sdk", "exec,read").Token)
	if res, err := cl.Exec(bounded(t), "idle", client.ExecRequest{Command: "echo kept > /workspace/f"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		sb, err := cl.Sandbox(bounded(t), "idle")
		if err != nil {
			t.Fatal(err)
		}
		if sb.State != "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the idle sandbox was never stopped by the server's sweeper")
		}
		time.Sleep(500 * time.Millisecond)
	}
	res, err := cl.Exec(bounded(t), "idle", client.ExecRequest{Command: "cat /workspace/f"})
	if err != nil || res.Stdout != "kept\n" {
		t.Fatalf("after the sweep: %+v, %v", res, err)
	}
}
