package egress

import (
	"context"
	"errors"
	"net"
)

// A session is the life of one command on the proxy: Begin gives the proxy that command's policy and token, and
// End takes both away again. Nothing opened in a session survives it: tunnels, decrypted connections and the
// connections the forwarding transports dialled (pooled or carrying a request) are all closed when the next
// session begins or this one ends, so a process a command left behind cannot reach the command's hosts, with its
// credentials, through a connection it opened in time, nor through a pooled upstream connection a later request
// would otherwise reuse.

// Begin starts a session: pol becomes the policy and token the only token accepted, and everything opened before
// (tunnels, decrypted connections, upstream connections) is closed. On error (pol does not compile, token is
// empty) nothing changes.
func (p *Proxy) Begin(pol Policy, token string) error {
	if token == "" {
		return errors.New("egress proxy: a session needs its own token")
	}
	c, err := compile(pol)
	if err != nil {
		return err
	}
	p.setToken("")
	p.cutAll()
	p.swap(c, false)
	p.setToken(token)
	return nil
}

// End ends the session: no token is accepted and the policy is none until the next Begin, and everything opened
// in the session is closed. The CA is kept for the next session (Begin replaces it if its policy needs other
// constraints). It is idempotent.
func (p *Proxy) End() {
	p.setToken("")
	none, _ := compile(Policy{Mode: ModeNone})
	p.swap(none, true)
	p.cutAll()
}

// cutAll closes every tunnel, decrypted connection and upstream connection of the proxy's own session (Begin), and
// drops its pools; the concurrent sessions' (Open) are theirs to close.
func (p *Proxy) cutAll() {
	p.mu.Lock()
	p.epoch++ // what is authenticated from here on belongs to the next session
	closeAll := p.connsOf(nil)
	p.mu.Unlock()
	closeAll()
	p.transport.CloseIdleConnections()
	p.tlsTransport.CloseIdleConnections()
}

// connsOf collects what session s has open (nil: the proxy's own session, Begin): its tunnels, decrypted
// connections and upstream connections. The caller holds p.mu and calls the returned closeAll after unlocking:
// closing waits on the network, never under the lock.
func (p *Proxy) connsOf(s *Session) (closeAll func()) {
	var tunnels []*tunnel
	for t := range p.tunnels {
		if t.sess == s {
			tunnels = append(tunnels, t)
		}
	}
	var raws []net.Conn
	for _, ic := range p.intercepts {
		if ic.sess == s {
			raws = append(raws, ic.raw)
		}
	}
	var ups []*upstreamConn
	for u := range p.upstreams {
		if u.sess == s {
			ups = append(ups, u)
		}
	}
	return func() {
		for _, t := range tunnels {
			t.close()
		}
		for _, c := range raws {
			_ = c.Close()
		}
		for _, u := range ups {
			_ = u.Close()
		}
	}
}

// openConns counts what cutAll would close (tests).
func (p *Proxy) openConns() (tunnels, intercepts, upstreams int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.tunnels), len(p.intercepts), len(p.upstreams)
}

// epochKey carries, in a request's context, the session it was authenticated in.
type epochKey struct{}

// sessionOf is the session ctx's request was authenticated in; ok is false outside a request.
func sessionOf(ctx context.Context) (uint64, bool) {
	e, ok := ctx.Value(epochKey{}).(uint64)
	return e, ok
}

// current reports whether epoch is still the proxy's session and the proxy is open; the caller holds p.mu.
func (p *Proxy) currentLocked(ctx context.Context) bool {
	if p.closed {
		return false
	}
	if s := sessionIn(ctx); s != nil {
		return !s.ended
	}
	e, ok := sessionOf(ctx)
	return !ok || e == p.epoch
}
