package api

import (
	"net/http"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

// E2BHooks is what the E2B front (internal/e2b, mounted at /e2b/) needs from the API about each request. The
// front authenticates itself (E2B's SDK sends its key as X-API-KEY, and its envd calls carry a sandbox's access
// token instead), so these give it the API's token check, rate limit, access log fields and error statuses.
type E2BHooks struct {
	// Authenticate checks key (a sandkeep API token, as the SDK's X-API-KEY sends it) as the API checks a
	// bearer token, then the token's scope and its tenant's request rate, and notes tenant and token for the
	// access log. Refusals are UNAUTHENTICATED, FORBIDDEN or RATE_LIMITED faults.
	Authenticate func(r *http.Request, key string, scope string) (store.Token, error)
	// Reauthenticate checks, by its hash, that the token which created an E2B sandbox is still live and carries
	// scope, then the tenant's request rate: an envd call carries the sandbox's access token, not the API key,
	// and a revoked or expired creator ends its sandbox's envd access.
	Reauthenticate func(r *http.Request, tokenHash string, scope string) (store.Token, error)
	// Status is the HTTP status and fault the API would answer err with (a non-fault error is INTERNAL, 500);
	// it notes the code for the access log and logs the cause of a 5xx.
	Status func(r *http.Request, err error) (*fault.Error, int)
	// RequestID returns the request's id (X-Request-Id, or the one the API made).
	RequestID func(r *http.Request) string
}

func (s *Server) e2bHooks() E2BHooks {
	return E2BHooks{
		Authenticate:   s.authenticateKey,
		Reauthenticate: s.reauthenticate,
		Status:         s.classify,
		RequestID:      func(r *http.Request) string { return requestIDFrom(r.Context()) },
	}
}

// authenticateKey is E2BHooks.Authenticate.
func (s *Server) authenticateKey(r *http.Request, key, scope string) (store.Token, error) {
	tok, err := auth.Verify(r.Context(), s.tokens, "Bearer "+key, s.now())
	return s.admitToken(r, tok, err, scope)
}

// reauthenticate is E2BHooks.Reauthenticate.
func (s *Server) reauthenticate(r *http.Request, hash, scope string) (store.Token, error) {
	tok, err := s.tokens.TokenByHash(r.Context(), hash)
	switch {
	case errdefs.IsNotFound(err) || (err == nil && auth.Status(tok, s.now()) != auth.StatusLive):
		err = fault.New(fault.Unauthenticated, "the token that created this sandbox was revoked or expired: create a new sandbox",
			"the sandbox's creator token is no longer valid")
	case err != nil:
		err = fault.Wrap(err, fault.StoreUnavailable, "check the run store", "cannot check the token")
	}
	return s.admitToken(r, tok, err, scope)
}

// admitToken finishes a token check: a tenant, the scope, the tenant's request rate; it notes the token for
// the access log.
func (s *Server) admitToken(r *http.Request, tok store.Token, err error, scope string) (store.Token, error) {
	if err == nil && tok.Tenant == "" {
		err = fault.New(fault.Unauthenticated, "ask the operator for a new token", "missing or invalid token")
	}
	if err != nil {
		return store.Token{}, err
	}
	info := infoOf(r)
	info.tenant, info.tokenID = tok.Tenant, tok.ID
	if scope != "" && !auth.Allows(tok, scope) {
		return store.Token{}, errForbidden(tok, scope)
	}
	if err := s.limits.request(tok.Tenant); err != nil {
		s.metrics.limited.WithLabelValues("requests").Inc()
		return store.Token{}, err
	}
	return tok, nil
}
