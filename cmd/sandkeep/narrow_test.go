package main

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestServeNetworkNarrowing: a caller's network block narrows its template's, never widens it, in the three
// ways issue 22 found it could. A loopback server of the test's own stands for what the template keeps out;
// for each template the command first reaches it through the template's own rules (so the path works), then
// asks with a caller's block that, compared as strings, looked narrower:
//   - open: an IP rule of the caller's would unlock loopback (refused: NETWORK_WIDENED before anything runs);
//   - an allowlist with a negation: the caller keeps the allow rule and drops the negation (the proxy refuses);
//   - inspect: on: the caller's block replaced the run's and the tunnel went through unread (it is inspected:
//     the upstream is dialed per decrypted request, so a bare handshake never reaches the server).
func TestServeNetworkNarrowing(t *testing.T) {
	t.Parallel()
	if gvisor() {
		t.Skip("under gVisor no sandbox has a network (TestExecRuntime); the refusals are TestNarrow's and TestNarrowDecides'")
	}
	c := newCLI(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var reached atomic.Int64
	go func() { // a TCP server that counts connections and answers one HTTP response to each
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			reached.Add(1)
			go func() {
				defer conn.Close()
				buf := make([]byte, 4096)
				_, _ = conn.Read(buf)
				_, _ = conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nreached"))
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	target := "127.0.0.1:" + port

	acme := c.ten("acme")
	cfg := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	conf := "templates:\n" +
		"  open:\n    image: " + testutil.ProbeImage(t) + "\n    network: {mode: open}\n    tenants: [" + acme + "]\n" +
		"  negated:\n    image: " + testutil.ProbeImage(t) + "\n    network: {mode: allowlist, rules: [\"127.0.0.1\", \"!" + target + "\"]}\n    tenants: [" + acme + "]\n" +
		"  inspected:\n    image: " + testutil.ProbeImage(t) + "\n    network: {mode: allowlist, rules: [\"127.0.0.1\"], inspect: \"on\"}\n    tenants: [" + acme + "]\n" +
		"tenant_templates:\n  " + acme + ": open\n"
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	s := c.startServer(t, "--config", cfg)
	tok := c.createToken(t, acme, "t", "").Token
	exec := func(user, template, command, network string) httpAnswer {
		body := map[string]any{"command": command, "template": template}
		if network != "" {
			body["network"] = json.RawMessage(network)
		}
		b, _ := json.Marshal(body)
		return s.raw(t, "POST", "/v1/sandboxes/"+user+"/exec", tok, strings.NewReader(string(b)), "Content-Type", "application/json")
	}
	stdout := func(a httpAnswer) string {
		t.Helper()
		var v struct{ Stdout, Stderr string }
		if a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &v) != nil {
			t.Fatalf("exec: %d %s", a.status, a.body)
		}
		return v.Stdout + v.Stderr
	}
	get := "skprobe proxied http://" + target + "/"
	handshake := "skprobe sni " + target + " ''"
	callerIP := `{"mode":"allowlist","rules":["127.0.0.1"]}`

	// open: the template reaches loopback only through an IP rule; the caller's own IP rule is refused.
	if out := stdout(exec("u-open", "open", get, "")); !strings.Contains(out, "denied=loopback") || reached.Load() != 0 {
		t.Fatalf("open template on its own: %q (reached %d)", out, reached.Load())
	}
	if a := exec("u-open", "open", get, callerIP); a.status != http.StatusForbidden || !strings.Contains(a.body, `"NETWORK_WIDENED"`) || reached.Load() != 0 {
		t.Errorf("a caller's IP rule under open: %d %s (reached %d)", a.status, a.body, reached.Load())
	}

	// negated: the template's negation holds whatever the caller's block keeps.
	if out := stdout(exec("u-neg", "negated", get, "")); !strings.Contains(out, "denied=denied-by-rule") || reached.Load() != 0 {
		t.Fatalf("negated template on its own: %q (reached %d)", out, reached.Load())
	}
	if out := stdout(exec("u-neg", "negated", get, callerIP)); !strings.Contains(out, "denied=denied-by-rule") || reached.Load() != 0 {
		t.Errorf("a caller's block dropping the negation: %q (reached %d)", out, reached.Load())
	}

	// inspected: the template's own rules reach the server by a request; a bare handshake is inspected, so the
	// server is not dialed, with or without the caller's block.
	if out := stdout(exec("u-insp", "inspected", get, "")); !strings.Contains(out, "status 200") || reached.Load() != 1 {
		t.Fatalf("inspected template, a request: %q (reached %d)", out, reached.Load())
	}
	for _, network := range []string{"", callerIP} {
		if out := stdout(exec("u-insp", "inspected", handshake, network)); !strings.Contains(out, "handshake ok") || reached.Load() != 1 {
			t.Errorf("inspected template, a handshake with block %q: %q (reached %d, want 1: not tunnelled)", network, out, reached.Load())
		}
	}
}
