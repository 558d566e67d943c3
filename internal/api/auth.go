package api

import (
	"context"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

// Tokens finds a presented token by its hash. store.TokenStore satisfies it.
type Tokens interface {
	// TokenByHash returns the token whose Hash is hash (hex SHA-256), revoked and expired ones included, or an
	// error that wraps errdefs.ErrNotFound.
	TokenByHash(ctx context.Context, hash string) (store.Token, error)
}

var _ auth.Lookup = Tokens(nil)

// Scopes a token may carry (see internal/auth). ScopeAdmin implies every other scope.
const (
	ScopeExec  = auth.ScopeExec  // run commands
	ScopeFiles = auth.ScopeFiles // read and write workspace files
	ScopeRead  = auth.ScopeRead  // list and inspect sandboxes, runs and events
	ScopeAdmin = auth.ScopeAdmin // everything, stopping and removing sandboxes included
)

// authenticate returns the live token r carries. Every request looks its token up again, so revocation and
// expiry take effect on the next one. Every refused token gets the same answer (auth.Verify).
func (s *Server) authenticate(r *http.Request) (store.Token, error) {
	header := r.Header.Get("Authorization")
	if header == "" {
		header = subprotocolToken(r) // a browser's WebSocket (wsauth.go)
	}
	tok, err := auth.Verify(r.Context(), s.tokens, header, s.now())
	if err == nil && tok.Tenant == "" { // the store refuses such a token; fail closed if one appears anyway
		return store.Token{}, fault.New(fault.Unauthenticated, "ask the operator for a new token", "missing or invalid token")
	}
	return tok, err
}

// authed wraps h: a live token, every scope in scopes, the tenant's request rate; then h runs with the token's
// tenant in its context.
func (s *Server) authed(scopes []string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok, err := s.authenticate(r)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		info := infoOf(r)
		info.tenant, info.tokenID = tok.Tenant, tok.ID
		for _, sc := range scopes {
			if !auth.Allows(tok, sc) {
				s.writeError(w, r, errForbidden(tok, sc))
				return
			}
		}
		if err := s.limits.request(tok.Tenant); err != nil {
			s.metrics.limited.WithLabelValues("requests").Inc()
			s.writeError(w, r, err)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), tokenKey{}, tok)))
	}
}

// metricsAuth wraps /metrics: with Config.MetricsToken set, "Authorization: Bearer <MetricsToken>" is required;
// without one, /metrics is refused unless the operator opened it (Config.MetricsOpen): the metrics name tenants.
func (s *Server) metricsAuth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.metricsT == "" && !s.metricsOpen {
			s.writeError(w, r, fault.New(fault.Unauthenticated,
				"set metrics_token_env (and send Authorization: Bearer <it>), or metrics_open: true in the server config",
				"/metrics needs a token: the server has none configured and /metrics is not opened"))
			return
		}
		if s.metricsT != "" {
			got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
			if subtle.ConstantTimeCompare([]byte(got), []byte(s.metricsT)) != 1 {
				s.writeError(w, r, fault.New(fault.Unauthenticated,
					"send Authorization: Bearer <the server's metrics token>", "missing or invalid metrics token"))
				return
			}
		}
		h(w, r)
	}
}

type tokenKey struct{}

// tokenOf returns the token that authenticated r (the zero Token outside authed).
func tokenOf(r *http.Request) store.Token {
	t, _ := r.Context().Value(tokenKey{}).(store.Token)
	return t
}

// tenantOf returns the tenant of the token that authenticated r ("" outside authed).
func tenantOf(r *http.Request) string { return tokenOf(r).Tenant }

// keyOf returns the Key of a route with {user}: the token's tenant and the path's user.
func keyOf(r *http.Request) (sandkeep.Key, error) {
	return sandkeep.NewKey(tenantOf(r), r.PathValue("user"))
}

// UserHeader names the user of an /mcp request.
const UserHeader = "Sandkeep-User"

// MCPHooks is what the /mcp handler needs from the API about each request. Every function is safe for
// concurrent use and fails closed on a request that did not come through the API's token auth.
type MCPHooks struct {
	// KeyFor returns the Key of a request: the tenant of its token and the user of its Sandkeep-User header.
	KeyFor func(r *http.Request) (sandkeep.Key, error)
	// Authorize returns nil when the request's token carries scope (admin carries all), else FORBIDDEN.
	Authorize func(r *http.Request, scope string) error
	// RequestID returns the request's id (X-Request-Id, or the one the API made).
	RequestID func(r *http.Request) string
}

var mcpHooks = MCPHooks{KeyFor: keyForMCP, Authorize: authorize, RequestID: func(r *http.Request) string {
	return requestIDFrom(r.Context())
}}

// keyForMCP returns the Key of an /mcp request: the token's tenant and the Sandkeep-User header's user.
func keyForMCP(r *http.Request) (sandkeep.Key, error) {
	if tenantOf(r) == "" { // only reachable if the MCP handler is served outside authed: fail closed
		return sandkeep.Key{}, errNotAuthed()
	}
	user := r.Header.Get(UserHeader)
	if user == "" {
		return sandkeep.Key{}, invalid("send the user in the "+UserHeader+" header", "the request names no user")
	}
	return sandkeep.NewKey(tenantOf(r), user)
}

// authorize is MCPHooks.Authorize.
func authorize(r *http.Request, scope string) error {
	tok := tokenOf(r)
	switch {
	case tok.Tenant == "":
		return errNotAuthed()
	case !auth.Allows(tok, scope):
		return errForbidden(tok, scope)
	}
	return nil
}

func errNotAuthed() error {
	return fault.New(fault.Unauthenticated, "serve /mcp through api.Server", "the request was not authenticated")
}

func errForbidden(tok store.Token, scope string) error {
	return fault.New(fault.Forbidden, "create a token with that scope: sandkeep token create --scopes "+scope,
		"the token %s lacks the %s scope", tok.ID, scope)
}
