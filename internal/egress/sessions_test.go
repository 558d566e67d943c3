package egress

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestSessionsConcurrent: two commands in flight at once, each a session (Open) with its own token and its own
// value for the same credential (one placeholder, as a key's commands see it), send requests side by side over
// inspected HTTPS, HTTP/1.1 and HTTP/2. Every request reaches the upstream with its own command's value and never
// the other's; each session's refusals go to its own command only; and ending one session closes its connections
// and refuses its token while the other's keep working.
func TestSessionsConcurrent(t *testing.T) {
	up := newUpstream(t, true)
	rec := newRecorder(t, map[string][]string{"api.test": {"192.88.99.10"}, "other.test": {"192.88.99.11"}})
	h := newInspectHarness(t, Policy{Mode: ModeNone}, rec)
	ph := NewPlaceholder("API_KEY")
	type cmd struct {
		name, token, value string
		s                  *Session
		client             *http.Client
		mu                 sync.Mutex
		blocks             []Block
	}
	cmds := []*cmd{
		{name: "a", token: "token-of-command-a", value: "sk-live-SENTINEL-of-command-a"},
		{name: "b", token: "token-of-command-b", value: "sk-live-SENTINEL-of-command-b"},
	}
	for i, c := range cmds {
		var err error
		c.s, err = h.p.Open(Policy{
			Mode: ModeAllowlist, Rules: rules(t, "api.test"),
			Credentials: []Credential{{Name: "API_KEY", Placeholder: ph, Value: c.value, Hosts: rules(t, "api.test")}},
		}, SessionConfig{Token: c.token, OnBlocked: func(b Block) {
			c.mu.Lock()
			c.blocks = append(c.blocks, b)
			c.mu.Unlock()
		}})
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(c.s.CA()) {
			t.Fatal("the session's CA is not a PEM certificate")
		}
		tr := &http.Transport{
			Proxy:           http.ProxyURL(&url.URL{Scheme: "http", User: url.UserPassword("sandbox", c.token), Host: h.addr}),
			TLSClientConfig: &tls.Config{RootCAs: roots},
		}
		tr.Protocols = new(http.Protocols)
		if i == 0 {
			tr.Protocols.SetHTTP1(true)
		} else {
			tr.Protocols.SetHTTP2(true)
		}
		t.Cleanup(tr.CloseIdleConnections)
		c.client = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	if _, err := h.p.Open(Policy{Mode: ModeOpen}, SessionConfig{Token: "token-of-command-a"}); err == nil {
		t.Error("a second session with a's token was opened")
	}

	const each = 20
	var wg sync.WaitGroup
	for _, c := range cmds {
		for i := range each {
			wg.Go(func() {
				req, _ := http.NewRequest(http.MethodGet, "https://api.test:"+up.port()+"/"+c.name+"/"+strconv.Itoa(i), nil)
				req.Header.Set("Authorization", "Bearer "+ph)
				req.Header.Set("X-Command", c.name)
				resp, err := c.client.Do(req)
				if err != nil {
					t.Errorf("command %s: %v", c.name, err)
					return
				}
				if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
					t.Errorf("command %s: %d %q", c.name, resp.StatusCode, body)
				}
				if e := resp.Header.Get("X-Echo"); e != "Bearer "+ph {
					t.Errorf("command %s: the echoed credential came back as %q, want the placeholder", c.name, e)
				}
			})
		}
	}
	wg.Wait()
	hits := up.seen()
	if len(hits) != 2*each {
		t.Fatalf("the upstream saw %d requests, want %d", len(hits), 2*each)
	}
	for _, hit := range hits {
		want := map[string]string{"a": "Bearer " + cmds[0].value, "b": "Bearer " + cmds[1].value}[hit.header.Get("X-Command")]
		if got := hit.header.Get("Authorization"); got != want || want == "" {
			t.Errorf("request %s of command %q carried %q, want %q", hit.uri, hit.header.Get("X-Command"), got, want)
		}
	}

	// b's refusal (a host its policy does not list) is b's event, not a's, nor the proxy's.
	resp, err := cmds[1].client.Get("https://other.test:" + up.port() + "/")
	if err == nil {
		_ = resp.Body.Close()
		t.Errorf("b reached other.test: %d", resp.StatusCode)
	}
	if len(cmds[0].blocks) != 0 || len(h.reported()) != 0 || len(cmds[1].blocks) != 1 || cmds[1].blocks[0].Host != "other.test" {
		t.Errorf("refusals: a %+v, b %+v, proxy %+v; want b's one, for other.test", cmds[0].blocks, cmds[1].blocks, h.reported())
	}

	// a ends, and so does the proxy's own session (Begin, End): a's token is refused and its connections are
	// closed; b's pooled connection still serves b.
	cmds[0].s.End()
	cmds[0].s.End()
	if err := h.p.Begin(Policy{Mode: ModeOpen}, "token-of-an-exclusive-command"); err != nil {
		t.Fatal(err)
	}
	h.p.End()
	if resp, _, _ := h.connect("api.test:"+up.port(), "Bearer "+cmds[0].token); resp.StatusCode != http.StatusProxyAuthRequired {
		t.Errorf("a's token after its End: %d, want 407", resp.StatusCode)
	}
	before := len(up.seen())
	req, _ := http.NewRequest(http.MethodGet, "https://api.test:"+up.port()+"/b/after", nil)
	req.Header.Set("Authorization", "Bearer "+ph)
	resp, err = cmds[1].client.Do(req)
	if err != nil {
		t.Fatalf("b after a ended: %v", err)
	}
	readAll(t, resp)
	if hits := up.seen()[before:]; len(hits) != 1 || hits[0].header.Get("Authorization") != "Bearer "+cmds[1].value || !resp.ProtoAtLeast(2, 0) {
		t.Errorf("b after a ended: %d hits %+v over %s", len(hits), hits, resp.Proto)
	}
	tunnels, intercepts, _ := h.p.openConns()
	if tunnels != 0 || intercepts != 1 {
		t.Errorf("after a's End: %d tunnels and %d decrypted connections open, want b's one (HTTP/2)", tunnels, intercepts)
	}
	cmds[1].s.End()
	waitClosed(t, h.p)
}
