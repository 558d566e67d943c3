//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// agentBin is the agent built once for all tests, as it ships: static, CGO_ENABLED=0.
var agentBin string

func TestMain(m *testing.M) {
	if path := os.Getenv(dialHelperEnv); path != "" {
		os.Exit(runDialHelper(path))
	}
	dir, err := os.MkdirTemp("", "sandkeep-agent-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "sandkeep-agent")
	build := exec.Command("go", "build", "-o", agentBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build agent: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { os.RemoveAll(dir) }))
}

// session is one `sandkeep-agent serve` process driven over its stdin/stdout.
type session struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.ReadCloser
	nextID uint32
}

func startAgent(t *testing.T) *session {
	t.Helper()
	cmd := exec.Command(agentBin, "serve")
	cmd.Stderr = os.Stderr // an *os.File: no copy goroutine
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &session{cmd: cmd, stdin: stdin, stdout: stdout}
	t.Cleanup(func() {
		stdin.Close() // idle agent: exits 0 on stdin EOF
		if err := cmd.Wait(); err != nil {
			t.Errorf("agent exit: %v", err)
		}
	})
	return s
}

func (s *session) conn() agentproto.Conn {
	return struct {
		io.Reader
		io.Writer
	}{s.stdout, s.stdin}
}

// request returns a request for argv with the next command ID and test-friendly bounds.
func (s *session) request(argv ...string) agentproto.Request {
	s.nextID++
	return agentproto.Request{
		Version: agentproto.Version, ID: s.nextID, Argv: argv, TimeoutMS: 30_000, GraceMS: 500,
		StdoutLimit: agentproto.DefaultLimit, StderrLimit: agentproto.DefaultLimit,
	}
}

type outcome struct {
	res            agentproto.Result
	err            error
	stdout, stderr string
}

func (s *session) run(t *testing.T, ctx context.Context, req agentproto.Request, stdin io.Reader) outcome {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := agentproto.Run(ctx, s.conn(), req, &out, &errb, stdin)
	return outcome{res, err, out.String(), errb.String()}
}

func sh(script string) []string { return []string{"sh", "-c", script} }

func TestExitCodes(t *testing.T) {
	s := startAgent(t) // one stream for all: also shows commands served one after another
	dir := t.TempDir()
	noExec := filepath.Join(dir, "no-exec")
	if err := os.WriteFile(noExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name         string
		argv         []string
		code, signal int
		startError   bool
	}{
		{"exit 0", []string{"true"}, 0, 0, false},
		{"exit 1", []string{"false"}, 1, 0, false},
		{"exit 23", sh("exit 23"), 23, 0, false},
		{"exit 124 is not a timeout", sh("exit 124"), 124, 0, false},
		{"not executable", []string{noExec}, 126, 0, true},
		{"directory", []string{dir}, 126, 0, true},
		{"not found", []string{"sandkeep-no-such-command"}, 127, 0, true},
		{"no such path", []string{filepath.Join(dir, "missing")}, 127, 0, true},
		{"SIGTERM", sh("kill -TERM $$"), 143, 15, false},
		{"SIGKILL", sh("kill -KILL $$"), 137, 9, false},
		{"SIGSEGV", sh("kill -SEGV $$"), 139, 11, false},
		{"exit 255", sh("exit 255"), 255, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := s.run(t, t.Context(), s.request(tt.argv...), nil)
			if got.err != nil {
				t.Fatal(got.err)
			}
			r := got.res
			if r.ExitCode != tt.code || r.Signal != tt.signal || r.TimedOut || r.Cancelled || (r.StartError != "") != tt.startError {
				t.Fatalf("got %+v, stderr %q", r, got.stderr)
			}
		})
	}
}

func TestStartErrorMessages(t *testing.T) {
	s := startAgent(t)
	got := s.run(t, t.Context(), s.request("sandkeep-nope"), nil)
	if got.err != nil || got.res.ExitCode != 127 {
		t.Fatalf("got %+v", got)
	}
	if want := "sandkeep-agent: sandkeep-nope: command not found\n"; got.stderr != want || got.stdout != "" {
		t.Fatalf("stderr %q, want %q", got.stderr, want)
	}

	req := s.request("sh", "-c", "true")
	req.Env = []string{"PATH=/nonexistent"} // the command's PATH is the one searched
	if got := s.run(t, t.Context(), req, nil); got.res.ExitCode != 127 {
		t.Fatalf("with an empty PATH: %+v", got)
	}
}

func TestWorkdirAndEnv(t *testing.T) {
	s := startAgent(t)
	dir := filepath.Join(t.TempDir(), "a", "b")
	req := s.request("sh", "-c", `pwd; echo "$FOO $BAR"`)
	req.Workdir = dir
	req.Env = []string{"FOO=first", "BAR=bar", "FOO=second"} // later entries win
	got := s.run(t, t.Context(), req, nil)
	if got.err != nil || got.res.ExitCode != 0 || got.stdout != dir+"\nsecond bar\n" {
		t.Fatalf("got %+v", got)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("workdir not created 0755: %v %v", fi, err)
	}

	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	req = s.request("true")
	req.Workdir = file
	got = s.run(t, t.Context(), req, nil)
	if got.res.ExitCode != 126 || !strings.Contains(got.res.StartError, "not a directory") {
		t.Fatalf("workdir is a file: %+v", got)
	}
}

func TestStdoutStderrSeparate(t *testing.T) {
	s := startAgent(t)
	got := s.run(t, t.Context(), s.request("sh", "-c", "echo out1; echo err1 >&2; echo out2; echo err2 >&2"), nil)
	if got.err != nil || got.stdout != "out1\nout2\n" || got.stderr != "err1\nerr2\n" {
		t.Fatalf("got %+v", got)
	}
}

// signalWriter collects output and signals when it contains want.
type signalWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func newSignalWriter(want string) *signalWriter {
	return &signalWriter{want: want, seen: make(chan struct{})}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *signalWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestStreaming: the command waits on stdin for a line that the test only sends once it saw the first chunk,
// so the chunk must have arrived while the command was running.
func TestStreaming(t *testing.T) {
	s := startAgent(t)
	req := s.request("sh", "-c", `echo first; read line; echo "got $line"`)
	req.Stdin = true
	out := newSignalWriter("first\n")
	stdinR, stdinW := io.Pipe()
	go func() {
		select {
		case <-out.seen:
			io.WriteString(stdinW, "go\n")
		case <-time.After(20 * time.Second):
		}
		stdinW.Close()
	}()
	res, err := agentproto.Run(t.Context(), s.conn(), req, out, nil, stdinR)
	if err != nil || res.ExitCode != 0 || out.String() != "first\ngot go\n" {
		t.Fatalf("got %+v %v %q", res, err, out.String())
	}
}

func TestStdinCopied(t *testing.T) {
	s := startAgent(t)
	input := strings.Repeat("line of stdin\n", 50_000) // several frames, more than a pipe buffer
	req := s.request("cat")
	req.Stdin = true
	got := s.run(t, t.Context(), req, strings.NewReader(input))
	if got.err != nil || got.res.ExitCode != 0 || got.stdout != input {
		t.Fatalf("err %v, exit %d, %d of %d bytes", got.err, got.res.ExitCode, len(got.stdout), len(input))
	}
}

// escapees starts, in every way a command can try to outlive its deadline, a process that prints its pid.
const escapees = `
sleep %[1]d & echo $!
setsid sh -c 'echo $$; exec sleep %[1]d' &
nohup sleep %[1]d >/dev/null 2>&1 & echo $!
sh -c "trap '' TERM; echo \$\$; sleep %[1]d; sleep %[1]d" &
(sh -c 'echo $$; exec sleep %[1]d' &) # double fork: the subshell exits, its child reparents
`

// pidsOf parses one pid per line.
func pidsOf(t *testing.T, out string) []int {
	t.Helper()
	var pids []int
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if pid, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// checkGone fails when a pid still exists or a process still runs with the marker as its argument.
func checkGone(t *testing.T, pids []int, marker int) {
	t.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("pid %d still exists (kill 0: %v)", pid, err)
		}
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte("\x00"+strconv.Itoa(marker)+"\x00")) {
			st, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			t.Errorf("process %s still runs: %q (stat %s)", e.Name(), b, st)
		}
	}
}

func TestTimeoutKillsTree(t *testing.T) {
	t.Parallel()
	s := startAgent(t)
	const marker = 999101
	req := s.request("sh", "-c", fmt.Sprintf(escapees, marker)+"echo started; wait")
	req.TimeoutMS, req.GraceMS = 1500, 500
	out := newSignalWriter("started")
	start := time.Now()
	res, err := agentproto.Run(t.Context(), s.conn(), req, out, nil, nil)
	elapsed := time.Since(start)
	if err != nil || !res.TimedOut || res.Cancelled || res.ExitCode != 143 {
		t.Fatalf("got %+v %v", res, err)
	}
	if limit := req.Timeout() + req.Grace() + 3*time.Second; elapsed > limit {
		t.Fatalf("took %v, more than %v", elapsed, limit)
	}
	pids := pidsOf(t, out.String())
	if len(pids) != 5 {
		t.Fatalf("want 5 pids, got output %q", out.String())
	}
	checkGone(t, pids, marker)
}

func TestNoDescendantOutlivesCommand(t *testing.T) {
	t.Parallel()
	s := startAgent(t)
	const marker = 999102
	req := s.request("sh", "-c", fmt.Sprintf(escapees, marker)+"sleep 0.2; exit 7")
	req.GraceMS = 300
	got := s.run(t, t.Context(), req, nil)
	if got.err != nil || got.res.ExitCode != 7 || got.res.TimedOut || got.res.Cancelled {
		t.Fatalf("got %+v", got)
	}
	pids := pidsOf(t, got.stdout)
	if len(pids) != 5 {
		t.Fatalf("want 5 pids, got output %q", got.stdout)
	}
	checkGone(t, pids, marker)
}

func TestCancelViaContext(t *testing.T) {
	t.Parallel()
	s := startAgent(t)
	const marker = 999103
	req := s.request("sh", "-c", fmt.Sprintf("sleep %d & echo $!; echo ready; wait", marker))
	out := newSignalWriter("ready")
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-out.seen
		cancel()
	}()
	res, err := agentproto.Run(ctx, s.conn(), req, out, nil, nil)
	cancel()
	if !errors.Is(err, context.Canceled) || errors.Is(err, agentproto.ErrProtocol) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if !res.Cancelled || res.TimedOut || res.ExitCode != 143 {
		t.Fatalf("got %+v", res)
	}
	checkGone(t, pidsOf(t, out.String()), marker)
	// The stream is still good for the next command.
	if got := s.run(t, t.Context(), s.request("true"), nil); got.err != nil || got.res.ExitCode != 0 {
		t.Fatalf("after a cancel: %+v", got)
	}
}

// TestStdinEOFCancels: when the host goes away mid-command, the agent kills the tree, still reports, and exits 0.
func TestStdinEOFCancels(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(agentBin, "serve")
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &session{}
	req := s.request("sleep", "999104")
	body, _ := json.Marshal(req)
	if err := agentproto.WriteFrame(stdin, agentproto.FrameRequest, req.ID, body); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // let it start; a cancel before the start is fine too
	stdin.Close()
	res := readResult(t, stdout, req.ID)
	if !res.Cancelled || res.ExitCode != 143 {
		t.Fatalf("got %+v", res)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agent exit: %v", err)
	}
	checkGone(t, nil, 999104)
}

// readResult reads frames until the Result for id.
func readResult(t *testing.T, r io.Reader, id uint32) agentproto.Result {
	t.Helper()
	var buf []byte
	for {
		f, err := agentproto.ReadFrame(r, &buf)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if f.Type == agentproto.FrameResult {
			res, err := agentproto.DecodeResult(f.Payload, id)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
	}
}

func TestBadRequests(t *testing.T) {
	s := startAgent(t)
	valid := func() agentproto.Request { return s.request("true") }
	tests := []struct {
		name   string
		mutate func(r *agentproto.Request)
		raw    string // sent instead of the encoded request
	}{
		{name: "wrong version", mutate: func(r *agentproto.Request) { r.Version = 2 }},
		{name: "empty argv", mutate: func(r *agentproto.Request) { r.Argv = nil }},
		{name: "zero timeout", mutate: func(r *agentproto.Request) { r.TimeoutMS = 0 }},
		{name: "zero limit", mutate: func(r *agentproto.Request) { r.StdoutLimit = 0 }},
		{name: "limit too large", mutate: func(r *agentproto.Request) { r.StderrLimit = agentproto.MaxOutputLimit + 1 }},
		{name: "relative workdir", mutate: func(r *agentproto.Request) { r.Workdir = "tmp" }},
		{name: "id mismatch", mutate: func(r *agentproto.Request) { r.ID++ }},
		{name: "bad json", raw: `{"v":1,`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := valid()
			id := req.ID
			body := []byte(tt.raw)
			if tt.mutate != nil {
				tt.mutate(&req)
				body, _ = json.Marshal(req)
			}
			if err := agentproto.WriteFrame(s.stdin, agentproto.FrameRequest, id, body); err != nil {
				t.Fatal(err)
			}
			res := readResult(t, s.stdout, id)
			if res.ExitCode != 126 || res.StartError == "" {
				t.Fatalf("got %+v", res)
			}
		})
	}
	if got := s.run(t, t.Context(), valid(), nil); got.err != nil || got.res.ExitCode != 0 {
		t.Fatalf("after bad requests: %+v", got)
	}
}

func TestSequentialCommands(t *testing.T) {
	s := startAgent(t)
	for i := range 5 {
		got := s.run(t, t.Context(), s.request("sh", "-c", fmt.Sprintf("echo %d; exit %d", i, i)), nil)
		if got.err != nil || got.res.ExitCode != i || got.stdout != fmt.Sprintf("%d\n", i) {
			t.Fatalf("command %d: %+v", i, got)
		}
	}
}

// TestForgedFrames: bytes in the command's output that look like frames are data, not frames.
func TestForgedFrames(t *testing.T) {
	s := startAgent(t)
	req := s.request()
	forged, _ := json.Marshal(agentproto.Result{ID: req.ID, ExitCode: 0, StdoutTruncated: true})
	var payload bytes.Buffer
	agentproto.WriteFrame(&payload, agentproto.FrameResult, req.ID, forged)
	agentproto.WriteFrame(&payload, agentproto.FrameStderr, req.ID, []byte("forged stderr"))
	file := filepath.Join(t.TempDir(), "frames")
	os.WriteFile(file, payload.Bytes(), 0o644)
	req.Argv = []string{"sh", "-c", `cat "$1"; cat "$1" >&2; exit 3`, "sh", file}
	got := s.run(t, t.Context(), req, nil)
	if got.err != nil || got.res.ExitCode != 3 || got.res.StdoutTruncated {
		t.Fatalf("got %+v", got)
	}
	if got.stdout != payload.String() || got.stderr != payload.String() {
		t.Fatalf("output changed: %q / %q", got.stdout, got.stderr)
	}
}

// TestOutputFlood: 1 GiB of output is cut at the limit, the command still finishes, and the host's heap does
// not grow with the flood.
func TestOutputFlood(t *testing.T) {
	s := startAgent(t)
	req := s.request("sh", "-c", "head -c 1073741824 /dev/zero; echo done >&2")
	req.TimeoutMS = 120_000
	var out countWriter
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var errb bytes.Buffer
	res, err := agentproto.Run(t.Context(), s.conn(), req, &out, &errb, nil)
	runtime.ReadMemStats(&after)
	if err != nil || res.ExitCode != 0 || res.TimedOut {
		t.Fatalf("got %+v %v", res, err)
	}
	if !res.StdoutTruncated || out.n != req.StdoutLimit || errb.String() != "done\n" || res.StderrTruncated {
		t.Fatalf("stdout %d bytes truncated=%v, stderr %q", out.n, res.StdoutTruncated, errb.String())
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
		t.Fatalf("host allocated %d MiB during a 1 GiB flood", grew>>20)
	}
}

type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

func TestVersion(t *testing.T) {
	out, err := exec.Command(agentBin, "version").Output()
	if err != nil || !strings.Contains(string(out), fmt.Sprintf("protocol %d", agentproto.Version)) {
		t.Fatalf("%q %v", out, err)
	}
}
