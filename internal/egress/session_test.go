package egress

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// TestSessionToken: each session accepts its own token only, and only while it lasts; the token a proxy was made
// with, or an earlier session's, is refused (407) as soon as the next session begins or this one ends.
func TestSessionToken(t *testing.T) {
	port := rawUpstream(t, func(c net.Conn) { _, _ = c.Read(make([]byte, 1)) })
	rec := newRecorder(t, map[string][]string{"raw.test": {"192.88.99.10"}})
	h := newHarness(t, Policy{Mode: ModeOpen}, rec)
	target := "raw.test:" + port

	if err := h.p.Begin(Policy{Mode: ModeOpen}, "token-of-command-a"); err != nil {
		t.Fatal(err)
	}
	if resp, _, _ := h.connect(target, bearer()); resp.StatusCode != http.StatusProxyAuthRequired {
		t.Errorf("the construction token during a session: %d, want 407", resp.StatusCode)
	}
	resp, tun, br := h.connect(target, "Bearer token-of-command-a")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT in session a: %d", resp.StatusCode)
	}
	h.p.End()
	_ = tun.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err == nil {
		t.Error("a tunnel of session a is still open after End")
	}
	if resp, _, _ := h.connect(target, "Bearer token-of-command-a"); resp.StatusCode != http.StatusProxyAuthRequired {
		t.Errorf("session a's token after End: %d, want 407", resp.StatusCode)
	}
	waitClosed(t, h.p)

	// The next command has no network: its session refuses everything, and a's token is still dead.
	if err := h.p.Begin(Policy{Mode: ModeNone}, "token-of-command-b"); err != nil {
		t.Fatal(err)
	}
	if resp, _, _ := h.connect(target, "Bearer token-of-command-a"); resp.StatusCode != http.StatusProxyAuthRequired {
		t.Errorf("session a's token in session b: %d, want 407", resp.StatusCode)
	}
	if resp, _, _ := h.connect(target, "Bearer token-of-command-b"); resp.StatusCode != http.StatusForbidden || resp.Header.Get(DeniedHeader) != ReasonModeNone {
		t.Errorf("session b (mode none): %d %q, want 403 mode-none", resp.StatusCode, resp.Header.Get(DeniedHeader))
	}
	if err := h.p.Begin(Policy{Mode: ModeOpen}, ""); err == nil {
		t.Error("Begin without a token was accepted")
	}
	if err := h.p.Begin(Policy{Mode: "sideways"}, "token-of-command-c"); err == nil {
		t.Error("Begin with a bad policy was accepted")
	}
	if resp, _, _ := h.connect(target, "Bearer token-of-command-b"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a refused Begin changed the session: %d, want 403 from session b", resp.StatusCode)
	}
}

// TestSessionPools: a pooled upstream connection dialled under one session's policy is closed when the session
// ends, so the next session's requests dial again under their own policy.
func TestSessionPools(t *testing.T) {
	var opened, closed atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok"))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			opened.Add(1)
		case http.StateClosed:
			closed.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	rec := newRecorder(t, map[string][]string{"pool.test": {"192.88.99.20"}})
	h := newHarness(t, Policy{Mode: ModeNone}, rec)
	pol := Policy{Mode: ModeAllowlist, Rules: rules(t, "pool.test")}
	get := func(token string) int {
		resp, _ := h.raw("GET http://pool.test:" + port + "/ HTTP/1.1\r\nHost: pool.test\r\nConnection: close\r\nProxy-Authorization: Bearer " + token + "\r\n\r\n")
		return resp.StatusCode
	}
	for i := range 2 {
		token := "token-of-command-" + strconv.Itoa(i)
		if err := h.p.Begin(pol, token); err != nil {
			t.Fatal(err)
		}
		if got := get(token); got != http.StatusOK {
			t.Fatalf("command %d: %d", i, got)
		}
		if _, _, up := h.p.openConns(); up != 1 {
			t.Errorf("command %d: %d upstream connections tracked, want the pooled one", i, up)
		}
		h.p.End()
		if _, _, up := h.p.openConns(); up != 0 {
			t.Errorf("after command %d: %d upstream connections left", i, up)
		}
		deadline := time.Now().Add(5 * time.Second)
		for closed.Load() != opened.Load() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if o, c := opened.Load(), closed.Load(); o != int32(i+1) || c != o {
			t.Errorf("after command %d: the upstream saw %d connections opened, %d closed; want %d, all closed", i, o, c, i+1)
		}
	}
}

// waitClosed waits for the proxy to have forgotten every connection (a closed tunnel is untracked when its
// handler returns) and fails the test when it does not within seconds.
func waitClosed(t *testing.T, p *Proxy) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		tn, ic, up := p.openConns()
		if tn+ic+up == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after End: %d tunnels, %d decrypted, %d upstream connections still open", tn, ic, up)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
