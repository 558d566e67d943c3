package egress

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Network modes.
const (
	ModeNone      = "none"      // nothing gets out
	ModeAllowlist = "allowlist" // only what a rule allows
	ModeDenylist  = "denylist"  // everything a negated rule does not deny
	ModeOpen      = "open"      // everything a negated rule does not deny
)

// Reasons a request is refused, besides the address classes (ClassLoopback, ...). Each is the Reason of the
// Block and the value of the X-Sandkeep-Denied header.
const (
	ReasonModeNone    = "mode-none"       // the network mode is none
	ReasonUnlisted    = "not-allowlisted" // allowlist mode and no rule matches
	ReasonRule        = "denied-by-rule"  // the last matching rule is negated (Block.Rule names it)
	ReasonInvalidHost = "invalid-host"    // the host does not parse (NormalizeHost)
	ReasonProxyLoop   = "proxy-loop"      // the target is the proxy's own listener
	ReasonSilent      = "silent"          // the host is on the silent list: refused, no event

	// TLS inspection and credentials.
	ReasonSNIMismatch    = "sni-mismatch"         // the TLS hello names another host than the CONNECT (Block.Host is the hello's)
	ReasonHostMismatch   = "host-mismatch"        // a decrypted request's Host is not the CONNECT host (Block.Host is the request's)
	ReasonNotTLS         = "not-tls"              // inspecting, and the client sent something else than a TLS hello in its tunnel (or a plain tunnel's hello does not parse)
	ReasonSNIFronting    = "sni-fronting"         // a plain tunnel's TLS hello names another host than the CONNECT (Block.Host is the hello's)
	ReasonSNIMissing     = "sni-missing"          // a plain tunnel to a name carries a TLS hello without a server name
	ReasonCredentialLeak = "credential-leak"      // a credential's placeholder or value heading to a host it may not go to (Block.Rule names it)
	ReasonPlaintext      = "credential-plaintext" // a credential's placeholder in a plain-HTTP request to its host, which it may reach over TLS only (Block.Rule names it)
)

// DeniedHeader is the response header of a refusal; its value is the reason.
const DeniedHeader = "X-Sandkeep-Denied"

// Bounds. The tunnel idle timeout is copied into the Proxy so tests can shorten it.
const (
	maxHeaderBytes    = 32 << 10         // a request's header block
	headerTimeout     = 10 * time.Second // from connection (or previous response) to a whole request header
	idleTimeout       = 90 * time.Second // a kept-alive client connection with no request
	resolveTimeout    = 5 * time.Second  // one name resolution
	dialTimeout       = 10 * time.Second // connecting to the checked addresses, all attempts together
	responseTimeout   = 60 * time.Second // a forwarded request's response header
	tunnelIdleTimeout = 5 * time.Minute  // a CONNECT tunnel with no byte in either direction
	maxResponseHeader = 1 << 20          // an upstream response's header block
	bodyReadTimeout   = 30 * time.Second // reading the scanned start of a request body
	scanSlots         = 8                // request bodies scanned at once, per proxy (each holds up to bodyScanLimit)
	maxStreams        = 64               // concurrent HTTP/2 streams on one decrypted connection
)

// Policy is where a sandbox may connect to, and what the proxy does for it on the way.
type Policy struct {
	Mode   string   // none (also ""), allowlist, denylist or open
	Rules  []Rule   // last match wins
	Silent []string // rules (usually hosts: telemetry endpoints) whose hosts are always refused, without an event

	// Credentials are injected into requests to their hosts and refused everywhere else (see Credential).
	Credentials []Credential
	// Inspect is the TLS inspection setting: "" or InspectAuto (on when there are Credentials), InspectOn or
	// InspectOff. Off, a CONNECT is a plain tunnel: credentials reach plain-HTTP requests only, and an HTTPS
	// request to a credential's host carries its placeholder unchanged.
	Inspect string
	// Narrow, when set, is a caller's narrowing (Narrow makes it): a request passes only when the rules above
	// and the narrowing both allow it.
	Narrow *Narrowing
}

// Block is one refusal, as OnBlocked receives it (and as the network_blocked event records it).
type Block struct {
	Host   string     // the host as normalised, or as given when it does not normalise
	Port   uint16     // the port asked for
	Rule   string     // the rule that denied it, when one did
	Reason string     // a Reason* or Class* constant
	Addr   netip.Addr // the resolved address refused, for an address class or a proxy loop
}

// Resolver looks up the addresses of a name; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config configures a Proxy. Policy and Token are required.
type Config struct {
	Policy Policy
	Token  string // the per-sandbox bearer token: "Bearer <token>" or Basic with any user and the token as password

	// Resolver resolves target names; nil is net.DefaultResolver. The proxy checks every address it returns
	// and dials only those.
	Resolver Resolver
	// Dial connects to a checked address ("ip:port", never a name); nil is a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// OnBlocked is told of every refusal except those of silent hosts. It is called on the request's
	// goroutine, so it must not block for long. Nil: refusals are not reported.
	OnBlocked func(Block)
	// OnReflected is told when a response carried an injected credential back and the proxy scrubbed it, once
	// per response, credential and place (header or body). Like OnBlocked it must not block. Nil: not reported.
	OnReflected func(Reflection)
	// Self lists the proxy's own addresses: refused as targets unless a rule names them.
	Self []netip.Addr
	// Refused adds ranges refused like the private ones (class operator) unless an IP or CIDR rule names them:
	// the host's own public NAT address, a provider's host endpoints, a partner network.
	Refused []netip.Prefix
	// UpstreamRoots verifies upstream servers when the proxy inspects TLS; nil is the host's roots.
	UpstreamRoots *x509.CertPool
}

// Proxy is one sandbox's egress proxy: an HTTP/1.1 forward proxy (CONNECT tunnels and absolute-form plain
// HTTP requests) that authenticates the sandbox by its token, decides every request by the policy, resolves
// names itself, refuses internal addresses, and dials exactly the addresses it checked. With TLS inspection
// on it also decrypts CONNECT tunnels (HTTP/1.1 and HTTP/2) and decides, injects credentials into, and
// forwards each request in them. It is an http.Handler; Serve runs it on a listener and Close stops it and
// waits for everything it started. SetPolicy and SetOnBlocked may be called at any time.
type Proxy struct {
	pol       atomic.Pointer[policy]            // never nil; replaced whole by SetPolicy
	onBlock   atomic.Pointer[func(Block)]       // nil: refusals are not reported
	onReflect atomic.Pointer[func(Reflection)]  // nil: reflections are not reported
	tokenSum  atomic.Pointer[[sha256.Size]byte] // nil: no token is valid (between two sessions, see End)
	resolver  Resolver
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
	self      []netip.Addr
	refused   []netip.Prefix // Config.Refused, masked

	srv          *http.Server
	forward      *httputil.ReverseProxy // plain HTTP, over transport
	transport    *http.Transport
	inspect      *httputil.ReverseProxy // decrypted requests, over tlsTransport
	tlsTransport *http.Transport
	inner        *http.Server  // serves decrypted connections, handed to it through innerLn
	innerLn      *connListener //
	tunnelIdle   time.Duration
	noPeek       bool          // benchmarks only (ForBench): plain tunnels without the ClientHello check
	noAuth       bool          // benchmarks only (ForBench): requests neither authenticated nor tied to a session
	scans        chan struct{} // one slot per request body being scanned: at most scanSlots*bodyScanLimit held
	bodyTimeout  time.Duration // bodyReadTimeout; tests shorten it

	ctx    context.Context // cancelled by Close: ends resolutions, dials and forwarded requests
	cancel context.CancelFunc

	caMu  sync.Mutex    // guards ca; SetPolicy stores pol under it too
	ca    *authority    // nil until inspection first needs it, and while inspection is off
	caGen atomic.Uint64 // counts CA changes

	mu           sync.Mutex
	closed       bool                           // set once by Close; no request starts after it
	epoch        uint64                         // the session: counts cutAll; a request of an older one opens nothing
	listeners    []netip.AddrPort               // every address Serve listens on: a target there is a loop
	tunnels      map[*tunnel]struct{}           // open CONNECT tunnels, closed by Close, Begin and End
	upstreams    map[*upstreamConn]struct{}     // forwarding connections to upstreams (pooled or in use), closed likewise
	intercepts   map[*tls.Conn]*inspectConn     // decrypted connections, from hijack to closed, closed by Close
	sessions     map[[sha256.Size]byte]*Session // the concurrent sessions (Open), by their token's hash
	innerStarted bool                           // inner is serving innerLn
	wg           sync.WaitGroup                 // requests, tunnel goroutines, decrypted connections, inner's Serve
}

var _ http.Handler = (*Proxy)(nil)

// New checks cfg and returns a Proxy that is not serving yet. A policy error is a fault.NetworkInvalid.
func New(cfg Config) (*Proxy, error) {
	if cfg.Token == "" {
		return nil, errors.New("egress proxy: no token: every sandbox's proxy needs its own")
	}
	pol, err := compile(cfg.Policy)
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		resolver:    cfg.Resolver,
		dial:        cfg.Dial,
		tunnelIdle:  tunnelIdleTimeout,
		tunnels:     make(map[*tunnel]struct{}),
		intercepts:  make(map[*tls.Conn]*inspectConn),
		upstreams:   make(map[*upstreamConn]struct{}),
		sessions:    make(map[[sha256.Size]byte]*Session),
		scans:       make(chan struct{}, scanSlots),
		bodyTimeout: bodyReadTimeout,
	}
	p.setToken(cfg.Token)
	p.pol.Store(pol)
	p.SetOnBlocked(cfg.OnBlocked)
	p.SetOnReflected(cfg.OnReflected)
	for _, a := range cfg.Self {
		p.self = append(p.self, a.Unmap().WithZone(""))
	}
	for _, r := range cfg.Refused {
		if !r.IsValid() {
			return nil, errors.New("egress proxy: a refused range is not a valid prefix")
		}
		if r.Addr().Is4In6() && r.Bits() >= 96 {
			r = netip.PrefixFrom(r.Addr().Unmap(), r.Bits()-96)
		}
		p.refused = append(p.refused, r.Masked())
	}
	if p.resolver == nil {
		p.resolver = net.DefaultResolver
	}
	if p.dial == nil {
		d := &net.Dialer{KeepAlive: 30 * time.Second}
		p.dial = d.DialContext
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.transport = &http.Transport{
		Proxy:                  nil, // never another proxy: this one is the way out
		DialContext:            p.dialForward,
		DisableCompression:     true, // pass the client's Accept-Encoding and the body as they are
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        idleTimeout,
		ResponseHeaderTimeout:  responseTimeout,
		MaxResponseHeaderBytes: maxResponseHeader,
	}
	p.transport.Protocols = new(http.Protocols)
	p.transport.Protocols.SetHTTP1(true)
	p.tlsTransport = &http.Transport{
		Proxy:                  nil,
		DialContext:            p.dialForward,
		TLSClientConfig:        &tls.Config{RootCAs: cfg.UpstreamRoots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:    headerTimeout,
		DisableCompression:     true,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        idleTimeout,
		ResponseHeaderTimeout:  responseTimeout,
		MaxResponseHeaderBytes: maxResponseHeader,
	}
	p.tlsTransport.Protocols = new(http.Protocols)
	p.tlsTransport.Protocols.SetHTTP1(true)
	p.tlsTransport.Protocols.SetHTTP2(true)
	quiet := log.New(io.Discard, "", 0)
	p.forward = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      p.transport,
		ErrorLog:       quiet,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   upstreamFailed,
		BufferPool:     copyBuffers,
	}
	p.inspect = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      p.tlsTransport,
		ErrorLog:       quiet,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   upstreamFailed,
		BufferPool:     copyBuffers,
	}
	p.srv = &http.Server{
		Handler:           p,
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          quiet,
	}
	p.srv.Protocols = new(http.Protocols)
	p.srv.Protocols.SetHTTP1(true)
	p.innerLn = newConnListener()
	p.inner = &http.Server{
		Handler:           http.HandlerFunc(p.serveInspected),
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          quiet,
		ConnContext:       p.inspectContext,
		ConnState:         p.inspectState,
	}
	// HTTP/2 is served on a *tls.Conn whose ALPN chose h2: Serve configures it because TLSConfig is nil (the
	// handshake is done before the connection is handed over, so the server needs no TLS config of its own).
	p.inner.Protocols = new(http.Protocols)
	p.inner.Protocols.SetHTTP1(true)
	p.inner.Protocols.SetHTTP2(true)
	p.inner.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: maxStreams}
	return p, nil
}

// Serve accepts sandbox connections on l until Close; it returns nil once Close has been called. It may be
// called for more than one listener. A target at l's address is refused as a loop.
func (p *Proxy) Serve(l net.Listener) error {
	if ap, err := netip.ParseAddrPort(l.Addr().String()); err == nil {
		p.mu.Lock()
		p.listeners = append(p.listeners, netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port()))
		p.mu.Unlock()
	}
	err := p.srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops the proxy: it closes the listeners, every client connection and tunnel, cancels resolutions,
// dials and forwarded requests, and returns once every request handler and tunnel goroutine has ended.
// It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for sum, s := range p.sessions {
		s.ended = true
		delete(p.sessions, sum)
		defer s.closeIdle()
	}
	tunnels := make([]*tunnel, 0, len(p.tunnels))
	for t := range p.tunnels {
		tunnels = append(tunnels, t)
	}
	raws := make([]net.Conn, 0, len(p.intercepts))
	for _, ic := range p.intercepts {
		raws = append(raws, ic.raw)
	}
	p.mu.Unlock()

	p.cancel()
	err := p.srv.Close()
	_ = p.inner.Close()
	_ = p.innerLn.Close()
	for _, t := range tunnels {
		t.close()
	}
	for _, c := range raws {
		_ = c.Close() // the raw connection, not the TLS one: no close_notify to wait on
	}
	p.wg.Wait()
	p.transport.CloseIdleConnections()
	p.tlsTransport.CloseIdleConnections()
	return err
}

// enter admits one request unless the proxy is closed; the caller calls p.wg.Done when it ends.
func (p *Proxy) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.wg.Add(1)
	return true
}

// ServeHTTP authenticates and decides one request, then tunnels (CONNECT) or forwards (plain HTTP) it.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !p.enter() {
		http.Error(w, "sandkeep egress: proxy closed", http.StatusServiceUnavailable)
		return
	}
	defer p.wg.Done()
	ctx := r.Context()
	if !p.noAuth {
		p.mu.Lock()
		epoch := p.epoch
		p.mu.Unlock()
		got, ok := presented(r.Header.Get("Proxy-Authorization"))
		own := ok && p.authorized(got)
		var s *Session
		if ok && !own {
			s = p.sessionFor(got)
		}
		if !own && s == nil {
			w.Header().Add("Proxy-Authenticate", `Bearer realm="sandkeep"`)
			w.Header().Add("Proxy-Authenticate", `Basic realm="sandkeep"`)
			http.Error(w, "sandkeep egress: proxy authentication required", http.StatusProxyAuthRequired)
			return
		}
		ctx = context.WithValue(ctx, epochKey{}, epoch)
		if s != nil {
			ctx = context.WithValue(ctx, sessKey{}, s)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()
	if r.Method == http.MethodConnect {
		p.serveConnect(ctx, w, r)
		return
	}
	p.serveForward(ctx, w, r)
}

// presented is the token h carries, as "Bearer <token>" or "Basic base64(user:token)"; ok is false when it
// carries none.
func presented(h string) (got string, ok bool) {
	scheme, cred, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok {
		return "", false
	}
	cred = strings.TrimSpace(cred)
	switch {
	case strings.EqualFold(scheme, "Bearer"):
		return cred, true
	case strings.EqualFold(scheme, "Basic"):
		b, err := base64.StdEncoding.DecodeString(cred)
		if err != nil {
			return "", false
		}
		_, pass, ok := strings.Cut(string(b), ":")
		return pass, ok
	}
	return "", false
}

// authorized reports whether got is the token of the proxy's own session (Begin). Both sides are hashed first so
// the comparison takes the same time whatever the length of what was sent.
func (p *Proxy) authorized(got string) bool {
	want := p.tokenSum.Load()
	if want == nil {
		return false
	}
	sum := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(sum[:], want[:]) == 1
}

// setToken makes token the only one accepted; "" accepts none.
func (p *Proxy) setToken(token string) {
	if token == "" {
		p.tokenSum.Store(nil)
		return
	}
	sum := sha256.Sum256([]byte(token))
	p.tokenSum.Store(&sum)
}

// verdict is the decision on one target.
type verdict struct {
	status int   // 0: allowed; else the status to refuse with
	block  Block // the refusal, when status is 400 or 403
	silent bool  // refused without an event
	host   string
	ip     netip.Addr // host as an address, when isIP
	isIP   bool
	port   uint16
	addrs  []netip.AddrPort // allowed: the checked addresses, to dial in this order and no other
}

// decide is decideWith under the current policy.
func (p *Proxy) decide(ctx context.Context, rawHost string, port uint16) verdict {
	return p.decideWith(ctx, p.policyOf(ctx), rawHost, port)
}

// decideWith applies pol to host (as the client wrote it, without its port) and port: the name against the
// rules, then every address it resolves to against the refused address classes, which only an IP or CIDR
// rule unlocks. It resolves at most once and returns the addresses it checked.
func (p *Proxy) decideWith(ctx context.Context, pol *policy, rawHost string, port uint16) verdict {
	name, ip, isIP, err := NormalizeHost(rawHost)
	if err != nil {
		return p.refuse(ctx, http.StatusBadRequest, Block{Host: cut(rawHost), Port: port, Reason: ReasonInvalidHost})
	}
	b := Block{Host: name, Port: port}
	if r, _ := match(pol.silent, name, ip, isIP, port); r != nil {
		b.Reason = ReasonSilent
		return verdict{status: http.StatusForbidden, block: b, silent: true}
	}
	if pol.mode == ModeNone {
		b.Reason = ReasonModeNone
		return p.refuse(ctx, http.StatusForbidden, b)
	}
	switch r, ok := match(pol.rules, name, ip, isIP, port); {
	case r != nil && !ok:
		b.Reason, b.Rule = ReasonRule, r.String()
		return p.refuse(ctx, http.StatusForbidden, b)
	case r == nil && pol.mode == ModeAllowlist:
		b.Reason = ReasonUnlisted
		return p.refuse(ctx, http.StatusForbidden, b)
	}
	if reason, rule := pol.narrow.denies(name, ip, isIP, port); reason != "" {
		b.Reason, b.Rule = reason, rule
		return p.refuse(ctx, http.StatusForbidden, b)
	}

	addrs := []netip.Addr{ip}
	if !isIP {
		rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
		addrs, err = p.resolver.LookupNetIP(rctx, "ip", name)
		cancel()
		if err != nil || len(addrs) == 0 {
			return verdict{status: http.StatusBadGateway, host: name}
		}
	}
	checked := make([]netip.AddrPort, 0, len(addrs))
	for _, a := range addrs {
		a = a.Unmap()
		b.Addr = a
		if p.isListener(a, port) {
			b.Reason = ReasonProxyLoop
			return p.refuse(ctx, http.StatusForbidden, b)
		}
		r, ok := MatchAddr(pol.ipRules, a, port)
		if r != nil && !ok {
			b.Reason, b.Rule = ReasonRule, r.String()
			return p.refuse(ctx, http.StatusForbidden, b)
		}
		unlocked := r != nil
		if n := pol.narrow; n != nil {
			nr, ok := MatchAddr(n.ipRules, a, port)
			if nr != nil && !ok {
				b.Reason, b.Rule = ReasonRule, nr.String()
				return p.refuse(ctx, http.StatusForbidden, b)
			}
			unlocked = unlocked && nr != nil // an address class needs both to unlock it
		}
		if class := classify(a, p.self, p.refused...); class != "" && !unlocked {
			b.Reason = class
			return p.refuse(ctx, http.StatusForbidden, b)
		}
		checked = append(checked, netip.AddrPortFrom(a.WithZone(""), port))
	}
	return verdict{host: name, ip: ip, isIP: isIP, port: port, addrs: checked}
}

// refuse reports b to ctx's session, or the proxy's OnBlocked outside one (unless nobody listens), and returns the refusal.
func (p *Proxy) refuse(ctx context.Context, status int, b Block) verdict {
	if s := sessionIn(ctx); s != nil {
		if s.onBlock != nil {
			s.onBlock(b)
		}
		return verdict{status: status, block: b}
	}
	if f := p.onBlock.Load(); f != nil {
		(*f)(b)
	}
	return verdict{status: status, block: b}
}

// cut bounds a host that did not parse before it goes into an event.
func cut(s string) string {
	const n = 255
	if len(s) > n {
		return s[:n]
	}
	return s
}

// isListener reports whether a:port is where the proxy itself listens.
func (p *Proxy) isListener(a netip.Addr, port uint16) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.listeners {
		if l.Port() != port {
			continue
		}
		if l.Addr() == a {
			return true
		}
		if l.Addr().IsUnspecified() && (a.IsLoopback() || a.IsUnspecified() || classify(a, p.self) == ClassSelf) {
			return true
		}
	}
	return false
}

// respond writes a refusal or a failure.
func respond(w http.ResponseWriter, v verdict) {
	if v.status == http.StatusBadGateway {
		http.Error(w, "sandkeep egress: cannot resolve or reach the host", http.StatusBadGateway)
		return
	}
	w.Header().Set(DeniedHeader, v.block.Reason)
	http.Error(w, "sandkeep egress: refused: "+v.block.Reason, v.status)
}

// badRequest answers a request without a usable target.
func badRequest(w http.ResponseWriter, msg string) {
	http.Error(w, "sandkeep egress: "+msg, http.StatusBadRequest)
}

// dialChecked connects to the first of addrs that answers, within dialTimeout and until Close.
func (p *Proxy) dialChecked(ctx context.Context, addrs []netip.AddrPort) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()
	var errs []error
	for _, a := range addrs {
		c, err := p.dial(ctx, "tcp", a.String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, errors.New("no checked address to dial")
	}
	return nil, errors.Join(errs...)
}

// serveConnect opens a tunnel to the authority-form target of a CONNECT request.
func (p *Proxy) serveConnect(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	target := r.URL.Host
	if target == "" {
		badRequest(w, "CONNECT without a host")
		return
	}
	host, port, err := SplitHostPort(target)
	if err != nil {
		respond(w, p.refuse(ctx, http.StatusBadRequest, Block{Host: cut(target), Reason: ReasonInvalidHost}))
		return
	}
	if port == 0 {
		badRequest(w, "CONNECT needs host:port")
		return
	}
	pol := p.policyOf(ctx)
	v := p.decideWith(ctx, pol, host, port)
	if v.status != 0 {
		respond(w, v)
		return
	}
	if pol.inspect {
		p.intercept(ctx, w, pol, v)
		return
	}
	up, err := p.dialChecked(ctx, v.addrs)
	if err != nil {
		respond(w, verdict{status: http.StatusBadGateway})
		return
	}
	client, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		_ = up.Close()
		http.Error(w, "sandkeep egress: cannot tunnel on this connection", http.StatusInternalServerError)
		return
	}
	t := &tunnel{client: client, upstream: up, idle: p.tunnelIdle}
	if !p.track(ctx, t) {
		t.close()
		return
	}
	defer p.untrack(t)
	_ = client.SetDeadline(time.Now().Add(headerTimeout))
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		t.close()
		return
	}
	// The client's first bytes are checked before any reaches the upstream (a TLS hello's server name must be the
	// CONNECT host); they, and whatever else it sent after its request, are in brw's buffer, not the socket.
	t.first = func() bool { return p.checkHello(ctx, client, brw.Reader, up, v) }
	t.run(&p.wg)
}

// track registers an open tunnel so Close, Begin and End can end it; false when the proxy is already closed or
// the request's session is over.
func (p *Proxy) track(ctx context.Context, t *tunnel) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.currentLocked(ctx) {
		return false
	}
	t.sess = sessionIn(ctx)
	p.tunnels[t] = struct{}{}
	return true
}

func (p *Proxy) untrack(t *tunnel) {
	p.mu.Lock()
	delete(p.tunnels, t)
	p.mu.Unlock()
}

// tunnel is one CONNECT tunnel: bytes copied both ways, both ends closed when either direction ends or no
// byte has moved either way for idle.
type tunnel struct {
	client, upstream net.Conn
	sess             *Session // the concurrent session (Open) it was opened in; nil: the proxy's own (Begin)
	idle             time.Duration
	first            func() bool  // run before the client's bytes are copied to the upstream; false ends the tunnel
	last             atomic.Int64 // unix nanoseconds when a copy last reported bytes moved, either way
	once             sync.Once
}

// run copies both ways, one direction on a goroutine counted in wg, and returns when both have ended.
func (t *tunnel) run(wg *sync.WaitGroup) {
	t.touch()
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		if t.first == nil || t.first() {
			t.copy(t.upstream, t.client)
		}
		t.close()
	}()
	t.copy(t.client, t.upstream)
	t.close()
	<-done
}

func (t *tunnel) touch() { t.last.Store(time.Now().UnixNano()) }

// copy copies src to dst until src ends, either fails, or the tunnel is idle. Between two kernel sockets
// (TCP, or the Unix socket a sandbox reaches its proxy by) io.Copy moves the bytes with splice(2), never
// through this process's memory. Idleness is kept with deadlines, which splice honours:
//   - src's read deadline is a quarter of the idle timeout away, so the copy returns that often and records
//     whether bytes moved; a direction that moved none ends only when the whole tunnel, both directions, has
//     been idle for the timeout (a long one-way download keeps the quiet direction open);
//   - dst's write deadline is the idle timeout away: a write that makes no progress for that long (the peer
//     stopped reading) ends the tunnel, even when both ends are stuck writing. Bytes cut off by it are lost,
//     which is why it ends the tunnel rather than continuing.
//
// A read deadline never loses bytes: splice empties its pipe into dst before it reads from src again.
func (t *tunnel) copy(dst, src net.Conn) {
	tick := t.idle / 4
	for {
		start := time.Now()
		if t.idle > 0 {
			_ = src.SetReadDeadline(start.Add(tick))
			_ = dst.SetWriteDeadline(start.Add(t.idle))
		}
		n, err := io.Copy(dst, src)
		if n > 0 {
			t.touch()
		}
		if err == nil || t.idle <= 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return // src ended, or a real error
		}
		now := time.Now()
		if now.Sub(start) >= t.idle || now.Sub(time.Unix(0, t.last.Load())) >= t.idle {
			return // a write stalled for the timeout, or nothing moved either way for it
		}
	}
}

// close closes both ends, once.
func (t *tunnel) close() {
	t.once.Do(func() {
		_ = t.client.Close()
		_ = t.upstream.Close()
	})
}

// forwardKey carries a forwarded request's checked target from serveForward or serveInspected to rewrite,
// dialForward and modifyResponse.
type forwardKey struct{}

type forwardTarget struct {
	scheme    string           // http, or https for a decrypted request
	authority string           // the outbound URL's host[:port], normalised
	addrs     []netip.AddrPort // the checked addresses
	host      string           // the target, normalised, and its port: for a Reflection
	port      uint16
	creds     *credPlan // the credentials injected, to scrub from the response
}

// serveForward forwards a plain-HTTP request in absolute form (GET http://host/path).
func (p *Proxy) serveForward(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	if !r.URL.IsAbs() || r.URL.Host == "" {
		badRequest(w, "no host: send an absolute URL (GET http://host/path) or CONNECT host:port")
		return
	}
	if !strings.EqualFold(r.URL.Scheme, "http") {
		badRequest(w, "only http:// is forwarded; use CONNECT for "+r.URL.Scheme)
		return
	}
	host, port, err := SplitHostPort(r.URL.Host)
	if err != nil {
		respond(w, p.refuse(ctx, http.StatusBadRequest, Block{Host: cut(r.URL.Host), Reason: ReasonInvalidHost}))
		return
	}
	explicit := port != 0
	if !explicit {
		port = 80
	}
	pol := p.policyOf(ctx)
	v := p.decideWith(ctx, pol, host, port)
	if v.status != 0 {
		respond(w, v)
		return
	}
	plan, release, ok := p.credentials(ctx, w, r, pol, v, false)
	defer release()
	if !ok {
		return
	}
	ctx = context.WithValue(ctx, forwardKey{}, forwardTarget{scheme: "http", authority: hostPort(v.host, port, explicit), addrs: v.addrs,
		host: v.host, port: v.port, creds: plan})
	p.forwarderOf(ctx).ServeHTTP(w, r.WithContext(ctx))
}

// credentials applies pol's credentials to r, a request to v's target over TLS (inspected) or not: it injects
// those the target may receive where their definitions say, or refuses r (403, a Block naming the credential)
// when it carries another's placeholder or value (credential-leak), or is plain HTTP and carries the placeholder
// of one that may go into TLS only (credential-plaintext). ok is false when r was answered.
func (p *Proxy) credentials(ctx context.Context, w http.ResponseWriter, r *http.Request, pol *policy, v verdict, tls bool) (plan *credPlan, release func(), ok bool) {
	cp := pol.planFor(v.host, v.ip, v.isIP, v.port, tls)
	plan, release = &cp, func() {}
	if name := plan.plaintext(r); name != "" {
		respond(w, p.refuse(ctx, http.StatusForbidden, Block{Host: v.host, Port: v.port, Rule: name, Reason: ReasonPlaintext}))
		return plan, release, false
	}
	if plan.scansBody(r) {
		// The start of the body is held from the check until it is forwarded: a slot (released by the caller when
		// the request is over) bounds how many are held at once, and a read deadline how long a stalled body may
		// hold one.
		select {
		case p.scans <- struct{}{}:
		case <-r.Context().Done():
			return plan, release, false
		}
		release = func() { <-p.scans }
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(p.bodyTimeout))
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	leak, err := plan.apply(r)
	if err != nil {
		http.Error(w, "sandkeep egress: cannot read the request body (too slow, or cut off)", http.StatusRequestTimeout)
		return plan, release, false
	}
	if leak != "" {
		respond(w, p.refuse(ctx, http.StatusForbidden, Block{Host: v.host, Port: v.port, Rule: leak, Reason: ReasonCredentialLeak}))
		return plan, release, false
	}
	return plan, release, true
}

// rewrite makes the outbound request: to the checked target, Host from the URL, without the proxy's
// credentials, forwarding headers or a protocol upgrade (hop-by-hop headers are already gone).
func rewrite(pr *httputil.ProxyRequest) {
	t, _ := pr.In.Context().Value(forwardKey{}).(forwardTarget)
	pr.Out.URL.Scheme = t.scheme
	pr.Out.URL.Host = t.authority
	pr.Out.URL.User = nil
	pr.Out.Host = ""
	pr.Out.Header.Del("Proxy-Authorization")
	pr.Out.Header.Del("Connection")
	pr.Out.Header.Del("Upgrade")
}

// errSwitch refuses a 101 response: upgrades are not forwarded (the request asked for none), so a server
// that switches anyway gets a 502 and no hijacked connection outside the proxy's accounting.
var errSwitch = errors.New("upstream switched protocols unasked")

// modifyResponse refuses a protocol switch and scrubs injected credentials from the response: every form the
// proxy produced (see credPlan.reflections), in the headers and, streaming, in the whole body, each reported once
// as a Reflection.
func (p *Proxy) modifyResponse(res *http.Response) error {
	if res.StatusCode == http.StatusSwitchingProtocols {
		return errSwitch
	}
	t, ok := res.Request.Context().Value(forwardKey{}).(forwardTarget)
	if !ok || t.creds == nil {
		return nil
	}
	reps := t.creds.reflections()
	if len(reps) == 0 {
		return nil
	}
	report := func(name, where string) {
		r := Reflection{Credential: name, Host: t.host, Port: t.port, Where: where}
		if s := sessionIn(res.Request.Context()); s != nil {
			if s.onReflect != nil {
				s.onReflect(r)
			}
			return
		}
		if f := p.onReflect.Load(); f != nil {
			(*f)(Reflection{Credential: name, Host: t.host, Port: t.port, Where: where})
		}
	}
	for _, name := range scrubHeader(res.Header, reps) {
		report(name, WhereHeader)
	}
	// Trailers arrive after the body, past any point where they could be scrubbed before the sandbox sees them.
	res.Trailer = nil
	if res.Body != nil && res.Body != http.NoBody {
		res.Body = newScrubReader(res.Body, reps, func(name string) { report(name, WhereBody) })
		res.ContentLength = -1
		res.Header.Del("Content-Length")
	}
	return nil
}

// SetOnReflected replaces the function told of scrubbed reflections (nil: none is reported).
func (p *Proxy) SetOnReflected(f func(Reflection)) {
	if f == nil {
		p.onReflect.Store(nil)
		return
	}
	p.onReflect.Store(&f)
}

// upstreamFailed answers a request the upstream did not: 502, saying when the upstream's certificate is
// what failed (the error itself is not shown: it may quote the request's URL).
func upstreamFailed(w http.ResponseWriter, _ *http.Request, err error) {
	var verr *tls.CertificateVerificationError
	if errors.As(err, &verr) {
		http.Error(w, "sandkeep egress: the upstream's TLS certificate is not trusted", http.StatusBadGateway)
		return
	}
	http.Error(w, "sandkeep egress: upstream failed", http.StatusBadGateway)
}

// dialForward is the forwarding transport's dialer: it connects to the addresses serveForward checked, never
// to a name, so a pooled or new connection always goes where the policy allowed.
func (p *Proxy) dialForward(ctx context.Context, _, _ string) (net.Conn, error) {
	t, ok := ctx.Value(forwardKey{}).(forwardTarget)
	if !ok || len(t.addrs) == 0 {
		return nil, errors.New("egress proxy: forward dial without a checked address")
	}
	c, err := p.dialChecked(ctx, t.addrs)
	if err != nil {
		return nil, err
	}
	uc := &upstreamConn{Conn: c, p: p, sess: sessionIn(ctx)}
	p.mu.Lock()
	if !p.currentLocked(ctx) {
		p.mu.Unlock()
		_ = c.Close()
		return nil, errors.New("egress proxy: closed, or the session that asked is over")
	}
	p.upstreams[uc] = struct{}{}
	p.mu.Unlock()
	return uc, nil
}

// upstreamConn is a forwarding transport's connection to an upstream, tracked so that Begin and End can close it
// whether it is pooled or carrying a request: no connection outlives the session whose policy dialled it.
type upstreamConn struct {
	net.Conn
	p    *Proxy
	sess *Session // as for tunnel
	once sync.Once
}

func (c *upstreamConn) Close() error {
	c.once.Do(func() {
		c.p.mu.Lock()
		delete(c.p.upstreams, c)
		c.p.mu.Unlock()
	})
	return c.Conn.Close()
}

// copyBuffers are the forwarding proxies' body buffers, shared by every Proxy of the process. A body cannot be
// spliced (it is framed, and may be scrubbed), so it is copied; ReverseProxy's default is a fresh 32 KiB buffer per
// body, and a body of unknown length (chunked, scrubbed) is flushed after every read, so a buffer four times
// larger is a quarter of the read, write and flush calls. The pool holds only buffers not in use.
var copyBuffers httputil.BufferPool = &bufferPool{size: copyBufferSize}

// copyBufferSize is the size of one forwarding body buffer.
const copyBufferSize = 128 << 10

type bufferPool struct {
	size int
	pool sync.Pool
}

func (bp *bufferPool) Get() []byte {
	if b, ok := bp.pool.Get().(*[]byte); ok {
		return *b
	}
	return make([]byte, bp.size)
}

func (bp *bufferPool) Put(b []byte) {
	if cap(b) == bp.size {
		b = b[:bp.size]
		bp.pool.Put(&b)
	}
}

// hostPort is the host[:port] authority of an upstream URL: an IPv6 host in brackets, the port only when withPort.
func hostPort(host string, port uint16, withPort bool) string {
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if withPort {
		host += ":" + strconv.Itoa(int(port))
	}
	return host
}
