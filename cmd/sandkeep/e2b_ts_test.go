package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/testutil"
)

// e2bSuiteDir is test/e2b-ts: the e2b npm SDK (pinned by its package-lock.json) and the suite that drives it.
func e2bSuiteDir(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "test", "e2b-ts")
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is not installed (scripts/test.sh installs it): %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err != nil {
		t.Fatalf("the e2b SDK is not installed: run `npm ci` in test/e2b-ts (scripts/test.sh does): %v", err)
	}
	return dir
}

// TestE2BTypeScript runs the e2b JavaScript SDK, unmodified and configured only by E2B_API_URL, E2B_SANDBOX_URL
// and E2B_API_KEY, against a real sandkeep serve: test/e2b-ts/suite.mjs creates a sandbox and drives commands
// (stdout, stderr, CommandExitError, env, cwd, timeouts, streaming, stdin), a background process (listed,
// connected to, killed), a PTY, files (text, a 300 KB binary, list, exists, makeDir, rename, remove, watchDir),
// getInfo, list, setTimeout, snapshots and fork, pause and connect, kill, another tenant's refusals, a bad key and bad input;
// on Docker under runc, the network: the caller's narrowing of a template's, carried by every command (a
// background process and a command beside it at once included), its refusals, and its update.
func TestE2BTypeScript(t *testing.T) {
	t.Parallel()
	testutil.Docker(t) // before the SDK's check: a run without Docker (the short tier) skips it as a Docker test
	dir := e2bSuiteDir(t)
	c := newCLI(t)
	conf := filepath.Join(t.TempDir(), "server.yaml")
	slow := c.ten("slow") // a tenant whose request rate the suite passes: RateLimitError
	yaml := "e2b:\n  max_timeout: 1h\nfiles:\n  max_file: 1m\n" +
		"tenants:\n  " + slow + ": {requests_per_second: 0.01, burst: 2}\n"
	netTarget, narrowed := "", ""
	var narrowedDials *atomic.Int64
	if c.kc == nil && !gvisor() { // the network checks: a template whose network allows two loopback servers of ours
		netTarget, _ = loopbackServer(t)
		narrowed, narrowedDials = loopbackServer(t) // allowed by the template, never by the suite's narrowing
		yaml += "templates:\n  net:\n    image: " + testutil.ProbeImage(t) + "\n" +
			"    network: {mode: allowlist, rules: [\"" + netTarget + "\", \"" + narrowed + "\", \"**.example.test\"]}\n    tenants: [" + c.ten("acme") + "]\n"
	}
	if err := os.WriteFile(conf, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	s := c.startServer(t, "--config", conf)
	own := c.createToken(t, c.ten("acme"), "e2b", "").Token
	other := c.createToken(t, c.ten("globex"), "e2b", "").Token
	slowKey := c.createToken(t, slow, "e2b", "").Token

	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "suite.mjs")
	cmd.Dir, cmd.WaitDelay = dir, 10*time.Second
	cmd.Env = append(os.Environ(), "E2B_API_URL="+s.url+"/e2b", "E2B_SANDBOX_URL="+s.url+"/e2b/envd",
		"E2B_API_KEY="+own, "E2B_OTHER_KEY="+other, "E2B_SLOW_KEY="+slowKey, "E2B_MAX_TIMEOUT_S=3600", "E2B_MAX_FILE=1048576")
	// Fork, snapshots and metrics are required on Docker. On kubernetes metrics are read too (the kubelet's
	// summary: internal/driver/kube TestStats), but the kubelet samples every ~10 s and the test node's hostPath
	// claims report no disk, so the suite only checks their shape there.
	if c.kc == nil {
		cmd.Env = append(cmd.Env, "E2B_EXPECT_FORK=1", "E2B_EXPECT_METRICS=1", "E2B_EXPECT_DISK=1")
	}
	if netTarget != "" {
		cmd.Env = append(cmd.Env, "E2B_NET_TARGET="+netTarget, "E2B_NET_NARROWED="+narrowed)
	}
	if c.processesServed() { // commands run beside a background one (elsewhere one at a time: docs/E2B.md)
		cmd.Env = append(cmd.Env, "E2B_CONCURRENT=1")
	}
	out, err := cmd.CombinedOutput()
	t.Logf("e2b suite:\n%s", out)
	if ctx.Err() != nil {
		t.Logf("server log:\n%s", s.log.String())
	}
	if err != nil || strings.Contains(string(out), "FAIL") || !strings.Contains(string(out), "all passed") {
		t.Errorf("the e2b SDK suite failed: %v", err)
	}
	// The suite asked for the narrowed server only from sandboxes whose network leaves it out: the proxy refused
	// each request before dialling it.
	if narrowedDials != nil && narrowedDials.Load() != 0 {
		t.Errorf("the server the sandboxes' network left out was dialled %d times, want none", narrowedDials.Load())
	}
}

// loopbackServer serves one HTTP answer to every connection on a loopback port of the test's and returns its
// address (what a template's network may allow and a caller's narrowing takes away) and the count of
// connections it accepted.
func loopbackServer(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var dials atomic.Int64
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			go func() {
				defer conn.Close()
				buf := make([]byte, 4096)
				_, _ = conn.Read(buf)
				_, _ = conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nreached"))
			}()
		}
	}()
	return ln.Addr().String(), &dials
}

// TestE2BTimeoutSurvivesRestart: a sandbox's E2B timeout is kept on the server's state home, so a restarted
// `sandkeep serve` enforces it: the sandbox made before the restart is still there after it, and the new
// process's sweeper removes it (its container and its record) once its timeout passes.
func TestE2BTimeoutSurvivesRestart(t *testing.T) {
	t.Parallel()
	testutil.Docker(t)
	c := newCLI(t)
	tenant := c.ten("acme")
	key := c.createToken(t, tenant, "e2b", "").Token
	e2b := func(s *server, method, path, body string) httpAnswer {
		t.Helper()
		return s.raw(t, method, "/e2b"+path, "", strings.NewReader(body), "X-API-KEY", key, "Content-Type", "application/json")
	}
	listed := func(s *server, user string) bool {
		t.Helper()
		a := s.raw(t, "GET", "/v1/sandboxes", key, nil)
		if a.status != 200 {
			t.Fatalf("list: %d %s", a.status, a.body)
		}
		return strings.Contains(a.body, `"user":"`+user+`"`)
	}

	s1 := c.startServer(t)
	made := time.Now()
	a := e2b(s1, "POST", "/v2/sandboxes", `{"timeout":20}`)
	if a.status != 201 {
		t.Fatalf("create: %d %s", a.status, a.body)
	}
	var sb struct{ SandboxID string }
	if err := json.Unmarshal([]byte(a.body), &sb); err != nil || sb.SandboxID == "" {
		t.Fatalf("create: %s (%v)", a.body, err)
	}
	user := "e2b-" + sb.SandboxID
	if err := s1.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s1.exited:
	case <-time.After(processBound):
		t.Fatal("sandkeep serve did not stop on SIGTERM")
	}

	s2 := c.startServer(t)
	if time.Since(made) < 18*time.Second { // before its end: the new process knows it and keeps it
		if a := e2b(s2, "GET", "/sandboxes/"+sb.SandboxID, ""); a.status != 200 || !listed(s2, user) {
			t.Fatalf("after the restart, before its timeout: %d %s", a.status, a.body)
		}
	}
	deadline := made.Add(20*time.Second + time.Minute)
	for listed(s2, user) || e2b(s2, "GET", "/sandboxes/"+sb.SandboxID, "").status != 404 {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still there a minute past its timeout after the restart", sb.SandboxID)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if gone := time.Since(made); gone < 20*time.Second {
		t.Errorf("removed %s after its create, before its 20s timeout", gone)
	}
}
