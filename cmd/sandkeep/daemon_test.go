package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/cmd/sandkeep/internal/fastpath"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// daemonStatusOf reads `sandkeep daemon status --json`.
func (c *cli) daemonStatusOf(t *testing.T) (daemonStatus, bool) {
	t.Helper()
	r := c.run(t, "daemon", "status", "--json")
	var st struct {
		Running bool `json:"running"`
		daemonStatus
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("daemon status --json: %v\n%s", err, r.stdout)
	}
	if st.Running != (r.code == 0) {
		t.Fatalf("daemon status: exit %d but running=%v", r.code, st.Running)
	}
	return st.daemonStatus, st.Running
}

// TestDaemon: calls through the home's daemon answer exactly as in-process ones; on without a daemon and a
// caller with another operator environment are refused clearly; a stale socket is replaced.
func TestDaemon(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	on := []string{"SANDKEEP_DAEMON=on"}
	off := []string{"SANDKEEP_DAEMON=off"}
	tenant := c.ten("d")

	c.runWith(t, nil, off, "daemon", "stop").want(t, 0)
	if _, running := c.daemonStatusOf(t); running {
		t.Fatal("a daemon runs before any was started")
	}
	r := c.runWith(t, nil, on, "exec", "--tenant", tenant, "--user", "u", "--", "true").wantFailure(t, "DAEMON_UNAVAILABLE")
	if !strings.Contains(r.stderr, "sandkeep daemon start") {
		t.Errorf("no hint to start it: %s", r.stderr)
	}

	c.run(t, "daemon", "start").want(t, 0)
	st, running := c.daemonStatusOf(t)
	if !running || st.PID <= 0 || st.Home != c.home {
		t.Fatalf("daemon status after start: %+v running=%v", st, running)
	}
	sock, err := os.Stat(filepath.Join(c.home, daemonSocketName))
	if err != nil || sock.Mode().Perm() != 0o600 || sock.Mode()&os.ModeSocket == 0 {
		t.Fatalf("the socket: %v %v", sock.Mode(), err)
	}

	// The same calls, in-process, through the daemon on the start-up fast path (cmd/sandkeep/internal/fastpath)
	// and through the daemon on main's path: the same output, exit statuses and errors.
	slow := append(on, fastpath.EnvFastPath+"=off")
	calls := [][]string{
		{"exec", "--tenant", tenant, "--user", "u", "--", "sh", "-c", "echo out; echo err >&2; exit 7"},
		{"exec", "--tenant", tenant, "--user", "u", "--", "sh", "-c", "kill -KILL $$"},
		{"exec", "--tenant", tenant, "--user", "u", "--", "no-such-command"},
		{"exec", "--tenant", tenant, "--user", "u", "--timeout", "1s", "--", "sleep", "30"},
		{"exec", "--tenant", tenant, "--user", "u", "--output-limit", "1KiB", "--", "sh", "-c", "yes | head -c 5000"},
		{"exec", "--tenant", tenant, "--user", "u", "-w", "sub", "--", "pwd"},
		{"exec", "--tenant", tenant, "--", "true"},
		{"exec", "--tenant", tenant, "--user", "u", "--timeout", "0s", "--", "true"},
		{"exec", "--tenant", tenant, "--user", "u", "--allow", "a..b", "--", "true"},
		{"exec", "--tenant", tenant, "--user", "u", "--spec", "/no-such.yaml", "--", "true"},
		{"stop", "--tenant", tenant, "--user", "nobody"},
		{"rm", "--tenant", tenant, "--user", "nobody"},
		{"events", "--run", "no-such-run"},
	}
	for _, args := range calls {
		in := c.runWith(t, nil, off, args...)
		for _, env := range [][]string{on, slow} {
			via := c.runWith(t, nil, env, args...)
			if in.code != via.code || in.stdout != via.stdout || in.stderr != via.stderr {
				t.Errorf("sandkeep %q:\nin-process: exit %d\nstdout %q\nstderr %q\ndaemon (%s): exit %d\nstdout %q\nstderr %q",
					args, in.code, in.stdout, in.stderr, env, via.code, via.stdout, via.stderr)
			}
		}
	}
	// The fast path serves the call before the heavy packages initialise: main's init never runs, nor
	// compose-go's JSON schema or client-go's scheme (GODEBUG=inittrace=1 lists each package's init on stderr
	// once it has finished: the fast path's own init ends the process, so its line is never written).
	r = c.runWith(t, nil, append(on, "GODEBUG=inittrace=1"), "exec", "--tenant", tenant, "--user", "u", "--", "sh", "-c", "echo out; exit 4").want(t, 4)
	inits := 0
	for _, line := range strings.Split(r.stderr, "\n") {
		if strings.HasPrefix(line, "init ") {
			inits++
		}
	}
	if r.stdout != "out\n" || inits == 0 || strings.Contains(r.stderr, "init github.com/sandkeep/sandkeep/cmd/sandkeep/internal/fastpath ") ||
		strings.Contains(r.stderr, "init main ") || strings.Contains(r.stderr, "santhosh-tekuri") || strings.Contains(r.stderr, "k8s.io/client-go") {
		t.Errorf("the fast path did not serve the call early:\nstdout %q\nstderr %s", r.stdout, r.stderr)
	}
	t.Logf("the fast path served the call after %d package inits had finished", inits)
	// stdin is sent only to a command that reads it (-i).
	for _, env := range [][]string{on, slow} {
		r = c.runWith(t, strings.NewReader("data\nmore\n"), env, "exec", "-i", "--tenant", tenant, "--user", "u", "--", "cat").want(t, 0)
		if r.stdout != "data\nmore\n" {
			t.Errorf("stdin through the daemon (%s): %q", env, r.stdout)
		}
	}
	// --json
	r = c.runWith(t, nil, on, "exec", "--json", "--tenant", tenant, "--user", "u", "--", "sh", "-c", "echo hi; exit 3").want(t, 3)
	var res jsonResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Stdout != "hi\n" || res.ExitCode != 3 {
		t.Errorf("--json through the daemon: %v %q", err, r.stdout)
	}
	// ps lists the sandbox through the daemon as in-process.
	psIn, psVia := c.runWith(t, nil, off, "ps"), c.runWith(t, nil, on, "ps")
	cols := func(s string) string { // IDLE FOR moves between the two calls
		var out []string
		for _, line := range strings.Split(s, "\n") {
			if f := strings.Fields(line); len(f) > 5 {
				out = append(out, strings.Join(f[:5], " "))
			}
		}
		return strings.Join(out, "\n")
	}
	if cols(psIn.stdout) != cols(psVia.stdout) || !strings.Contains(psVia.stdout, tenant) {
		t.Errorf("ps: in-process %q, daemon %q", psIn.stdout, psVia.stdout)
	}

	// Another operator environment: refused with on, in-process with auto.
	other := append(on, "SANDKEEP_GATE_WAIT=7s")
	r = c.runWith(t, nil, other, "exec", "--tenant", tenant, "--user", "u", "--", "true").wantFailure(t, "DAEMON_MISMATCH")
	c.runWith(t, nil, []string{"SANDKEEP_DAEMON=auto", "SANDKEEP_GATE_WAIT=7s"}, "exec", "--tenant", tenant, "--user", "u", "--", "true").want(t, 0)
	c.runWith(t, nil, []string{"SANDKEEP_DAEMON=maybe"}, "ps").wantFailure(t, "INVALID_ARGUMENT")

	// Stop; then a stale socket (its owner gone) is replaced by the next daemon.
	c.run(t, "daemon", "stop").want(t, 0)
	if _, running := c.daemonStatusOf(t); running {
		t.Fatal("the daemon still runs after stop")
	}
	if err := os.WriteFile(filepath.Join(c.home, daemonSocketName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c.runWith(t, nil, []string{"SANDKEEP_DAEMON=auto"}, "exec", "--tenant", tenant, "--user", "u", "--", "true").want(t, 0)
	st2, running := c.daemonStatusOf(t)
	if !running || !st2.Auto || st2.PID == st.PID {
		t.Fatalf("auto mode did not start a daemon over the stale socket: %+v running=%v", st2, running)
	}
}

// TestDaemonKilled: SIGKILL of the daemon mid-command. The caller is told (DAEMON_LOST), the command's tree is
// gone, the next call starts a new daemon that adopts the sandbox, and the store keeps every run.
func TestDaemonKilled(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	auto := []string{"SANDKEEP_DAEMON=auto"}
	tenant := c.ten("k")
	c.runWith(t, nil, auto, "exec", "--tenant", tenant, "--user", "u", "--", "sh", "-c", "echo kept > /workspace/f").want(t, 0)
	st, running := c.daemonStatusOf(t)
	if !running {
		t.Fatal("auto mode started no daemon")
	}
	runsBefore := c.runWith(t, nil, auto, "runs", "--json")

	type done struct {
		r   result
		err error
	}
	ch := make(chan done, 1)
	go func() {
		r, err := c.exec(t.Context(), nil, auto, "exec", "--tenant", tenant, "--user", "u", "--", "sh", "-c", "echo started; exec sleep 313")
		ch <- done{r, err}
	}()
	// The sandbox is warm: the command runs (and holds the key's gate) within a few seconds.
	time.Sleep(4 * time.Second)
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d := <-ch
	if d.err != nil {
		t.Fatal(d.err)
	}
	d.r.wantFailureAnyStdout(t, "DAEMON_LOST")

	// The next call starts a new daemon, which adopts the sandbox: the workspace is there, and the killed
	// command's tree is gone.
	var r result
	deadline := time.Now().Add(time.Minute)
	for {
		r = c.runWith(t, nil, auto, "exec", "--tenant", tenant, "--user", "u", "--", "sh", "-c", "cat /workspace/f; ps -o args | grep -c '^sleep 313' || true")
		if r.code == 0 && r.stdout == "kept\n0\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the kill: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
		}
		time.Sleep(500 * time.Millisecond)
	}
	st2, running := c.daemonStatusOf(t)
	if !running || st2.PID == st.PID {
		t.Fatalf("no new daemon: %+v", st2)
	}
	var before, after []map[string]any
	_ = json.Unmarshal([]byte(runsBefore.stdout), &before)
	if err := json.Unmarshal([]byte(c.runWith(t, nil, auto, "runs", "--json").stdout), &after); err != nil {
		t.Fatal(err)
	}
	ids := map[any]bool{}
	for _, run := range after {
		ids[run["id"]] = true
	}
	for _, run := range before {
		if !ids[run["id"]] {
			t.Errorf("run %v is lost from the store", run["id"])
		}
	}
	if len(after) < len(before)+2 {
		t.Errorf("runs: %d before, %d after (the killed one and the next should be there)", len(before), len(after))
	}
}

// wantFailureAnyStdout is wantFailure for a call whose command had printed before sandkeep failed.
func (r result) wantFailureAnyStdout(t *testing.T, code string) {
	t.Helper()
	r.want(t, exitFailure)
	if !strings.Contains(r.stderr, "sandkeep: "+code+": ") || !strings.Contains(r.stderr, "hint: ") {
		t.Fatalf("sandkeep %q: stderr does not say %s with a hint:\n%s", r.args, code, r.stderr)
	}
}

// TestDaemonNetwork: networked commands of one user from two CLI processes at once both reach their allowed
// loopback host through the one egress proxy the daemon serves, each under its own policy (--allow).
func TestDaemonNetwork(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	env := []string{"SANDKEEP_DAEMON=on", "SANDKEEP_IMAGE=" + testutil.ProbeImage(t)}
	var hosts [2]string
	for i, body := range []string{"one-7d1", "two-7d2"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) }))
		t.Cleanup(srv.Close)
		hosts[i] = strings.TrimPrefix(srv.URL, "http://")
	}
	// In the suite's daemon pass, newCLI's first call already started the home's daemon with the suite's image;
	// this test's daemon runs the probe image, so that one goes first.
	if _, err := c.exec(t.Context(), nil, nil, "daemon", "stop"); err != nil {
		t.Fatal(err)
	}
	c.runWith(t, nil, env, "daemon", "start").want(t, 0)
	tenant := c.ten("n")
	c.runWith(t, nil, env, "exec", "--tenant", tenant, "--user", "u", "--", "true").want(t, 0) // warm
	var wg sync.WaitGroup
	var res [2]result
	var errs [2]error
	for i := range 2 {
		own, other := hosts[i], hosts[1-i]
		wg.Go(func() {
			res[i], errs[i] = c.exec(t.Context(), nil, env, "exec", "--tenant", tenant, "--user", "u", "--allow", own, "--",
				"sh", "-c", testutil.ProbePath+" proxied http://"+own+"/; "+testutil.ProbePath+" proxied http://"+other+"/; true")
		})
	}
	wg.Wait()
	for i, want := range []string{"one-7d1", "two-7d2"} {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		r := res[i]
		notWant := []string{"two-7d2", "one-7d1"}[i]
		if r.code != 0 || !strings.Contains(r.stdout, "status 200") || !strings.Contains(r.stdout, want) || strings.Contains(r.stdout, notWant) {
			t.Errorf("process %d (allows %s): exit %d\nstdout %s\nstderr %s", i, hosts[i], r.code, r.stdout, r.stderr)
		}
		if strings.Contains(r.stderr, "EGRESS_UNAVAILABLE") {
			t.Errorf("process %d: %s", i, r.stderr)
		}
	}
}
