package api

import (
	"net/http"
	"strings"
	"testing"
)

// TestPortForwardUnavailable: a server whose backend cannot forward ports (the fake has neither DialPort nor
// ForwardPorts) answers both port routes with PORT_FORWARD_UNAVAILABLE and a hint, before any upgrade.
func TestPortForwardUnavailable(t *testing.T) {
	e := newEnv(t, nil)
	for _, path := range []string{"/v1/sandboxes/alice/ports", "/v1/sandboxes/alice/ports/8080"} {
		body := wantError(t, e.req("GET", path, e.tok, nil), http.StatusUnprocessableEntity, "PORT_FORWARD_UNAVAILABLE")
		if !strings.Contains(body.Hint, "docker driver") {
			t.Errorf("GET %s: hint %q", path, body.Hint)
		}
	}
}
