package fleet

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestProxy: a request about a key another replica owns is handed to that replica's internal address whole
// (method, path, body, the caller's Authorization, streamed answer), marked with the fleet secret; the owner's
// side serves it with its API and never hands it on. Without the secret, or with another, the internal address
// refuses it. An owner that cannot be reached is OWNER_UNAVAILABLE with nothing written.
func TestProxy(t *testing.T) {
	const secret = "0123456789abcdef-secret"
	st := openStore(t)
	key := mustKey(t, "alice")

	// The owner: its internal address serves an "API" that echoes what it got and whether it would hand on.
	ownerR := newReplica(t, st, "owner", time.Minute)
	in := NewInternal(NewHandler(&Backend{}, secret), secret)
	ownerSrv := httptest.NewServer(in)
	defer ownerSrv.Close()
	ownerR.cfg.Address = strings.TrimPrefix(ownerSrv.URL, "http://")
	if o, err := ownerR.Claim(t.Context(), key); err != nil || !o.Self {
		t.Fatalf("owner claim: %+v %v", o, err)
	}
	ownerProxy := NewProxy(ownerR, secret)
	in.SetAPI(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handedOn, err := ownerProxy.Forward(w, r, key)
		body, _ := io.ReadAll(r.Body)
		io.WriteString(w, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization")+" "+string(body)+" secret:"+r.Header.Get(SecretHeader))
		if handedOn || err != nil {
			io.WriteString(w, " handed on again")
		}
	}))

	// The other replica's API.
	other := newReplica(t, st, "other", time.Minute)
	p := NewProxy(other, secret)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served, err := p.Forward(w, r, key)
		if err != nil {
			http.Error(w, string(fault.CodeOf(err)), http.StatusServiceUnavailable)
			return
		}
		if !served {
			io.WriteString(w, "served here")
		}
	}))
	defer front.Close()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, front.URL+"/v1/sandboxes/alice/files/a.txt", strings.NewReader("content"))
	req.Header.Set("Authorization", "Bearer caller-token")
	resp, err := front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := "PUT /v1/sandboxes/alice/files/a.txt Bearer caller-token content secret:"; string(got) != want {
		t.Errorf("the owner got %q, want %q", got, want)
	}

	// The internal address without the secret, or with another one: refused before the API.
	for _, s := range []string{"", "another-secret-0123456789"} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, ownerSrv.URL+"/v1/sandboxes/alice/files/a.txt", nil)
		if s != "" {
			req.Header.Set(SecretHeader, s)
		}
		resp, err := ownerSrv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("secret %q: %s, want 401", s, resp.Status)
		}
	}

	// The owner's own requests are served there.
	rec := httptest.NewRecorder()
	if served, err := ownerProxy.Forward(rec, httptest.NewRequest(http.MethodGet, "/v1/sandboxes/alice/processes", nil), key); served || err != nil {
		t.Errorf("the owner's own request: served elsewhere %v, %v", served, err)
	}

	// An owner that went away: OWNER_UNAVAILABLE, nothing written.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	bob := mustKey(t, "bob")
	goneR := newReplica(t, st, "gone", time.Minute)
	goneR.cfg.Address = gone
	if _, err := goneR.Claim(t.Context(), bob); err != nil {
		t.Fatal(err)
	}
	rec = httptest.NewRecorder()
	served, err := p.Forward(rec, httptest.NewRequest(http.MethodGet, "/v1/sandboxes/bob/files/x", nil), sandkeep.Key(bob))
	if served || !fault.Is(err, fault.OwnerUnavailable) || rec.Body.Len() != 0 {
		t.Errorf("forward to a gone owner: served %v, %v, wrote %q; want OWNER_UNAVAILABLE, nothing written", served, err, rec.Body.String())
	}
}
