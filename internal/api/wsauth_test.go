package api

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/api/apitest"
)

// TestWebSocketSubprotocolToken: a WebSocket upgrade without an Authorization header may carry its token as the
// base64url.bearer.sandkeep. subprotocol (what a browser can send); it passes the same token check (here: past
// authentication to the route's own answer), while a bad one, two of them, or the subprotocol on a request that
// is not an upgrade are refused as a missing token.
func TestWebSocketSubprotocolToken(t *testing.T) {
	tokens := apitest.NewTokens()
	w := newWorld(t, tokens)
	tok, _ := tokens.Add("acme", ScopeExec)
	enc := func(s string) string { return WSTokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(s)) }
	upgrade := func(protocols ...string) []string {
		return []string{"Upgrade", "websocket", "Connection", "Upgrade", "Sec-WebSocket-Version", "13",
			"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol", strings.Join(protocols, ", ")}
	}
	const path = "/v1/sandboxes/nobody/ports/8080" // past authentication, the test backend says it cannot forward (422)
	for _, tc := range []struct {
		name string
		hdr  []string
		want int
	}{
		{"subprotocol token", upgrade(WSProtocol, enc(tok)), http.StatusUnprocessableEntity},
		{"subprotocol token alone", upgrade(enc(tok)), http.StatusUnprocessableEntity},
		{"wrong token", upgrade(WSProtocol, enc("sk_wrong")), http.StatusUnauthorized},
		{"not base64url", upgrade(WSProtocol, WSTokenPrefix+"!!!"), http.StatusUnauthorized},
		{"two tokens", upgrade(enc(tok), enc(tok)), http.StatusUnauthorized},
		{"no upgrade", []string{"Sec-WebSocket-Protocol", enc(tok)}, http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, hdr, body := w.do(t, "GET", path, "", "", tc.hdr...)
			if code != tc.want {
				t.Fatalf("status %d, want %d: %s", code, tc.want, body)
			}
			if strings.Contains(hdr.Get("Sec-WebSocket-Protocol"), WSTokenPrefix) {
				t.Fatal("the token came back in the answer")
			}
		})
	}
}
