package egress

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/http"
	"net/http/httputil"
	"slices"
	"time"
)

// Concurrent sessions: besides its own session (Begin and End), a proxy serves any number of sessions at once,
// one per command or process in flight (Open). Each has its own token, which is all that ties a request to it:
// its policy decides the request, its credentials (and only its) are injected into it and scrubbed from the
// answer, its refusals and reflections go to its own functions (the command's run), and its forwarding pools
// are its own, so no upstream connection one session dialled carries another's request. End closes everything
// opened in it and nothing else: the other sessions' tunnels, decrypted connections and upstream connections
// stay open.

// Session is one concurrent session of a Proxy (Open).
type Session struct {
	p         *Proxy
	sum       [sha256.Size]byte
	pol       *policy
	ca        *authority // the session's own CA, when its policy inspects TLS; nil otherwise
	onBlock   func(Block)
	onReflect func(Reflection)

	transport, tlsTransport *http.Transport
	forward, inspect        *httputil.ReverseProxy

	ended bool // under p.mu: set by End (or the proxy's Close); nothing more is opened in it
}

// SessionConfig is what Open needs besides the policy: the session's token (which no other session of the
// proxy may share) and where its refusals and scrubbed reflections go (nil: not reported).
type SessionConfig struct {
	Token       string
	OnBlocked   func(Block)
	OnReflected func(Reflection)
}

// Open starts a concurrent session with pol under cfg.Token, beside the proxy's own session and the other open
// ones, which it leaves as they are. A policy that inspects TLS gets a CA of its own (Session.CA), constrained to
// pol like the proxy's. Errors: pol does not compile (fault.NetworkInvalid), the token is empty or another
// session's, or the proxy is closed.
func (p *Proxy) Open(pol Policy, cfg SessionConfig) (*Session, error) {
	if cfg.Token == "" {
		return nil, errors.New("egress proxy: a session needs its own token")
	}
	c, err := compile(pol)
	if err != nil {
		return nil, err
	}
	s := &Session{p: p, sum: sha256.Sum256([]byte(cfg.Token)), pol: c, onBlock: cfg.OnBlocked, onReflect: cfg.OnReflected}
	if c.inspect {
		if s.ca, err = newAuthority(c.scope, time.Now()); err != nil {
			return nil, err
		}
	}
	s.transport, s.tlsTransport = p.transport.Clone(), p.tlsTransport.Clone()
	s.forward, s.inspect = new(httputil.ReverseProxy), new(httputil.ReverseProxy)
	*s.forward, *s.inspect = *p.forward, *p.inspect
	s.forward.Transport, s.inspect.Transport = s.transport, s.tlsTransport
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("egress proxy: closed")
	}
	if _, dup := p.sessions[s.sum]; dup || p.authorized(cfg.Token) {
		return nil, errors.New("egress proxy: the token is another session's")
	}
	p.sessions[s.sum] = s
	return s, nil
}

// End ends the session: its token is no longer accepted, and every tunnel, decrypted connection and upstream
// connection (pooled or carrying a request) opened in it is closed; the proxy's other sessions keep theirs. It is
// idempotent.
func (s *Session) End() {
	p := s.p
	p.mu.Lock()
	s.ended = true
	if p.sessions[s.sum] == s {
		delete(p.sessions, s.sum)
	}
	closeAll := p.connsOf(s)
	p.mu.Unlock()
	closeAll()
	s.closeIdle()
}

// CA returns the PEM certificate of the session's own CA, which a command of the session must trust; nil when its
// policy does not inspect TLS. It is valid for the CA's 24 hours: a session that may outlive them (a long
// process) is inspected with a CA past its end, and its clients refuse the leaves.
func (s *Session) CA() []byte {
	if s.ca == nil {
		return nil
	}
	return slices.Clone(s.ca.pem)
}

// closeIdle drops the session's pooled upstream connections.
func (s *Session) closeIdle() {
	s.transport.CloseIdleConnections()
	s.tlsTransport.CloseIdleConnections()
}

// sessKey carries, in a request's context, the concurrent session it was authenticated in.
type sessKey struct{}

// sessionIn is the concurrent session ctx's request belongs to, or nil (the proxy's own session, or none).
func sessionIn(ctx context.Context) *Session {
	s, _ := ctx.Value(sessKey{}).(*Session)
	return s
}

// sessionFor is the open concurrent session whose token is got, or nil. The lookup is by the token's hash, so
// its time does not depend on how much of a token a guess gets right.
func (p *Proxy) sessionFor(got string) *Session {
	sum := sha256.Sum256([]byte(got))
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sessions[sum]
}

// policyOf is the policy a request with ctx is decided under: its session's, else the proxy's current one.
func (p *Proxy) policyOf(ctx context.Context) *policy {
	if s := sessionIn(ctx); s != nil {
		return s.pol
	}
	return p.pol.Load()
}

// forwarderOf and inspectorOf are the plain and decrypted forwarders of ctx's session: its own pools, else the
// proxy's.
func (p *Proxy) forwarderOf(ctx context.Context) *httputil.ReverseProxy {
	if s := sessionIn(ctx); s != nil {
		return s.forward
	}
	return p.forward
}

func (p *Proxy) inspectorOf(ctx context.Context) *httputil.ReverseProxy {
	if s := sessionIn(ctx); s != nil {
		return s.inspect
	}
	return p.inspect
}

// caFor is the CA that signs the leaves of ctx's decrypted connection: its session's, else the proxy's.
func (p *Proxy) caFor(ctx context.Context) (*authority, error) {
	if s := sessionIn(ctx); s != nil {
		if s.ca == nil {
			return nil, errors.New("egress proxy: the session does not inspect TLS")
		}
		return s.ca, nil
	}
	a, _, err := p.currentCA(caLastMinute)
	return a, err
}
