package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// TLS inspection: a CONNECT the policy allows is answered 200, the client's TLS handshake is served by the
// proxy with a leaf for the CONNECT host signed by the proxy's ephemeral CA, and the decrypted connection is
// handed to an inner http.Server (HTTP/1.1, or HTTP/2 when ALPN chose h2). Each request on it is checked
// (its Host must be the CONNECT host; no CONNECT, no proxying to elsewhere), decided again under the current
// policy, given its credentials, and forwarded to the upstream over TLS verified against the host's roots,
// dialing only the addresses the decision checked.

// inspectKey carries a decrypted connection's *inspectConn into its requests' contexts.
type inspectKey struct{}

// inspectConn is one decrypted CONNECT.
type inspectConn struct {
	raw       net.Conn // the client's connection under TLS: what Close closes
	host      string   // the CONNECT host, normalised
	port      uint16
	authority string   // the upstream URL's host[:port]
	epoch     uint64   // the session the CONNECT was authenticated in
	sess      *Session // or the concurrent session (Open) it was authenticated in

	mu  sync.Mutex // guards pol and v
	pol *policy    // the policy v was decided under
	v   verdict    // the last allowing decision: reused while the policy is the same
}

var errSNIMismatch = errors.New("the TLS server name is not the CONNECT host")

// intercept serves an allowed CONNECT by decrypting it. v is the CONNECT's decision under pol.
func (p *Proxy) intercept(ctx context.Context, w http.ResponseWriter, pol *policy, v verdict) {
	ca, err := p.caFor(ctx)
	if err != nil || ca == nil {
		http.Error(w, "sandkeep egress: cannot inspect TLS: no CA", http.StatusInternalServerError)
		return
	}
	client, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "sandkeep egress: cannot tunnel on this connection", http.StatusInternalServerError)
		return
	}
	var conn net.Conn = client
	// Bytes the client sent after its request (a pipelined TLS hello) are in brw's buffer, not the socket.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		conn = &prefixConn{Conn: client, r: io.MultiReader(bytes.NewReader(slices.Clone(b)), client)}
	}
	ic := &inspectConn{raw: client, host: v.host, port: v.port, authority: hostPort(v.host, v.port, v.port != 443), pol: pol, v: v}
	ic.epoch, _ = sessionOf(ctx)
	ic.sess = sessionIn(ctx)
	sni := ""
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if hello.ServerName != "" { // no SNI (an IP target, or an old client): the CONNECT host
				if name, _, _, err := NormalizeHost(hello.ServerName); err != nil || name != ic.host {
					sni = hello.ServerName
					// Reported here, before the alert reaches the client: once the client has seen the
					// handshake fail, its command may end, and the refusal must still belong to its run.
					host := cut(sni)
					if err == nil {
						host = name
					}
					p.refuse(ctx, http.StatusForbidden, Block{Host: host, Port: v.port, Reason: ReasonSNIMismatch})
					return nil, errSNIMismatch
				}
			}
			return ca.leafFor(ic.host)
		},
	}
	tc := tls.Server(conn, cfg)
	if !p.trackIntercept(ctx, tc, ic) {
		_ = client.Close()
		return
	}
	fail := func() {
		_ = client.Close()
		p.releaseIntercept(tc)
	}
	_ = client.SetDeadline(time.Now().Add(headerTimeout))
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		fail()
		return
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		var notTLS tls.RecordHeaderError
		switch {
		case sni != "": // reported by GetCertificate
		case errors.As(err, &notTLS):
			p.refuse(ctx, http.StatusForbidden, Block{Host: v.host, Port: v.port, Reason: ReasonNotTLS})
		}
		fail()
		return
	}
	_ = client.SetDeadline(time.Time{})
	if !p.startInner() || !p.innerLn.push(tc) {
		fail()
	}
}

// trackIntercept registers a connection being decrypted so Close can end it, counting it in wg until the
// inner server is done with it (inspectState) or it fails first; false when the proxy is closed or the
// CONNECT's session is over.
func (p *Proxy) trackIntercept(ctx context.Context, tc *tls.Conn, ic *inspectConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.currentLocked(ctx) {
		return false
	}
	p.intercepts[tc] = ic
	p.wg.Add(1)
	return true
}

// releaseIntercept forgets a decrypted connection, once.
func (p *Proxy) releaseIntercept(tc *tls.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.intercepts[tc]; ok {
		delete(p.intercepts, tc)
		p.wg.Done()
	}
}

// startInner starts the inner server on innerLn, once; false when the proxy is closed.
func (p *Proxy) startInner() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	if !p.innerStarted {
		p.innerStarted = true
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			_ = p.inner.Serve(p.innerLn)
		}()
	}
	return true
}

// inspectContext is the inner server's ConnContext: it puts the connection's *inspectConn in the context of
// every request on it.
func (p *Proxy) inspectContext(ctx context.Context, c net.Conn) context.Context {
	tc, _ := c.(*tls.Conn)
	p.mu.Lock()
	ic := p.intercepts[tc]
	p.mu.Unlock()
	return context.WithValue(ctx, inspectKey{}, ic)
}

// inspectState is the inner server's ConnState: a closed connection is released.
func (p *Proxy) inspectState(c net.Conn, state http.ConnState) {
	if state != http.StateClosed && state != http.StateHijacked {
		return
	}
	if tc, ok := c.(*tls.Conn); ok {
		p.releaseIntercept(tc)
	}
}

// serveInspected decides, injects and forwards one decrypted request.
func (p *Proxy) serveInspected(w http.ResponseWriter, r *http.Request) {
	ic, _ := r.Context().Value(inspectKey{}).(*inspectConn)
	if ic == nil {
		http.Error(w, "sandkeep egress: connection not inspected", http.StatusInternalServerError)
		return
	}
	if !p.enter() {
		http.Error(w, "sandkeep egress: proxy closed", http.StatusServiceUnavailable)
		return
	}
	defer p.wg.Done()
	ctx := context.WithValue(r.Context(), epochKey{}, ic.epoch)
	if ic.sess != nil {
		ctx = context.WithValue(ctx, sessKey{}, ic.sess)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()

	// A CONNECT, or a request in absolute form for elsewhere, asks the far end to be a proxy: chaining.
	if r.Method == http.MethodConnect {
		host, port := ic.describe(r.Host)
		respond(w, p.refuse(ctx, http.StatusForbidden, Block{Host: host, Port: port, Reason: ReasonProxyLoop}))
		return
	}
	if r.URL.IsAbs() && (!strings.EqualFold(r.URL.Scheme, "https") || !ic.sameHost(r.URL.Host)) {
		host, port := ic.describe(r.URL.Host)
		respond(w, p.refuse(ctx, http.StatusForbidden, Block{Host: host, Port: port, Reason: ReasonProxyLoop}))
		return
	}
	if !ic.sameHost(r.Host) {
		host, port := ic.describe(r.Host)
		respond(w, p.refuse(ctx, http.StatusForbidden, Block{Host: host, Port: port, Reason: ReasonHostMismatch}))
		return
	}
	pol := p.policyOf(ctx)
	v := p.decideInspected(ctx, pol, ic)
	if v.status != 0 {
		respond(w, v)
		return
	}
	plan, release, ok := p.credentials(ctx, w, r, pol, v, true)
	defer release()
	if !ok {
		return
	}
	ctx = context.WithValue(ctx, forwardKey{}, forwardTarget{scheme: "https", authority: ic.authority, addrs: v.addrs,
		host: v.host, port: v.port, creds: plan})
	p.inspectorOf(ctx).ServeHTTP(w, r.WithContext(ctx))
}

// decideInspected decides the connection's target under pol: the decision already made under the same
// policy (the target is fixed for the connection), or a new one, resolving again.
func (p *Proxy) decideInspected(ctx context.Context, pol *policy, ic *inspectConn) verdict {
	ic.mu.Lock()
	if ic.pol == pol {
		v := ic.v
		ic.mu.Unlock()
		return v
	}
	ic.mu.Unlock()
	v := p.decideWith(ctx, pol, ic.host, ic.port)
	if v.status == 0 {
		ic.mu.Lock()
		ic.pol, ic.v = pol, v
		ic.mu.Unlock()
	}
	return v
}

// sameHost reports whether hostport (a Host header or URL host) names the CONNECT host, with its port or
// without one.
func (ic *inspectConn) sameHost(hostport string) bool {
	host, port, err := SplitHostPort(hostport)
	if err != nil {
		return false
	}
	name, _, _, err := NormalizeHost(host)
	return err == nil && name == ic.host && (port == 0 || port == ic.port)
}

// describe is hostport as a Block names it: normalised when it can be, with the CONNECT port when it has none.
func (ic *inspectConn) describe(hostport string) (string, uint16) {
	host, port, err := SplitHostPort(hostport)
	if err != nil {
		return cut(hostport), ic.port
	}
	if name, _, _, err := NormalizeHost(host); err == nil {
		host = name
	}
	if port == 0 {
		port = ic.port
	}
	return cut(host), port
}

// prefixConn is a connection whose first bytes were already read into a buffer.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// connListener hands connections to an http.Server: push blocks until the server accepts or the listener
// is closed.
type connListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newConnListener() *connListener {
	return &connListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return innerAddr{} }

// push hands c to the server; false when the listener is closed (c is then the caller's to close).
func (l *connListener) push(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

type innerAddr struct{}

func (innerAddr) Network() string { return "inspect" }
func (innerAddr) String() string  { return "inspect" }
