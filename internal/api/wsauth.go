package api

import (
	"encoding/base64"
	"net/http"
	"strings"
)

// Browsers cannot set an Authorization header on a WebSocket. Like Kubernetes'
// "base64url.bearer.authorization.k8s.io.<token>", a WebSocket client may instead offer its token as one of the
// subprotocols of the upgrade request, "base64url.bearer.sandkeep.<token in unpadded base64url>", next to
// WSProtocol. The server reads it only on an upgrade request without an Authorization header, never answers it
// back (it selects WSProtocol when offered, or none), and it then goes through exactly the same token check.
const (
	WSTokenPrefix = "base64url.bearer.sandkeep."
	WSProtocol    = "sandkeep.v1"
)

// subprotocolToken returns "Bearer <token>" from an upgrade request's token subprotocol, or "" when there is
// none, or when there are several or it does not decode (then the request has no token, and is refused as such).
func subprotocolToken(r *http.Request) string {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return ""
	}
	var found []string
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); strings.HasPrefix(p, WSTokenPrefix) {
				found = append(found, strings.TrimPrefix(p, WSTokenPrefix))
			}
		}
	}
	switch len(found) {
	case 0:
		return ""
	case 1:
		tok, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(found[0], "="))
		if err != nil || len(tok) == 0 {
			return "" // refused by the check, with the same answer as any missing or bad token
		}
		return "Bearer " + string(tok)
	}
	return ""
}
