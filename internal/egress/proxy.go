package egress

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
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
)

// Policy is where a sandbox may connect to.
type Policy struct {
	Mode   string   // none (also ""), allowlist, denylist or open
	Rules  []Rule   // last match wins
	Silent []string // rules (usually hosts: telemetry endpoints) whose hosts are always refused, without an event
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
	// Self lists the proxy's own addresses: refused as targets unless a rule names them.
	Self []netip.Addr
}

// Proxy is one sandbox's egress proxy: an HTTP/1.1 forward proxy (CONNECT tunnels and absolute-form plain
// HTTP requests) that authenticates the sandbox by its token, decides every request by the policy, resolves
// names itself, refuses internal addresses, and dials exactly the addresses it checked. It is an
// http.Handler; Serve runs it on a listener and Close stops it and waits for everything it started.
type Proxy struct {
	mode     string
	rules    []Rule // the policy's rules
	ipRules  []Rule // the IP and CIDR rules among them: the only ones that unlock a refused address class
	silent   []Rule
	tokenSum [sha256.Size]byte
	resolver Resolver
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	onBlock  func(Block)
	self     []netip.Addr

	srv        *http.Server
	forward    *httputil.ReverseProxy
	transport  *http.Transport
	tunnelIdle time.Duration

	ctx    context.Context // cancelled by Close: ends resolutions, dials and forwarded requests
	cancel context.CancelFunc

	mu        sync.Mutex
	closed    bool                 // set once by Close; no request starts after it
	listeners []netip.AddrPort     // every address Serve listens on: a target there is a loop
	tunnels   map[*tunnel]struct{} // open CONNECT tunnels, closed by Close
	wg        sync.WaitGroup       // requests in ServeHTTP and their tunnel goroutines
}

var _ http.Handler = (*Proxy)(nil)

// New checks cfg and returns a Proxy that is not serving yet.
func New(cfg Config) (*Proxy, error) {
	mode := cfg.Policy.Mode
	switch mode {
	case "":
		mode = ModeNone
	case ModeNone, ModeAllowlist, ModeDenylist, ModeOpen:
	default:
		return nil, fmt.Errorf("egress proxy: unknown network mode %q: want none, allowlist, denylist or open", mode)
	}
	if cfg.Token == "" {
		return nil, errors.New("egress proxy: no token: every sandbox's proxy needs its own")
	}
	silent, errs := ParseRules(cfg.Policy.Silent)
	if errs != nil {
		return nil, fmt.Errorf("egress proxy: silent list: %w", errs[0])
	}
	for _, r := range silent {
		if r.Negate {
			return nil, fmt.Errorf("egress proxy: silent list: %q is negated, which means nothing there", r.String())
		}
	}
	p := &Proxy{
		mode:       mode,
		rules:      append([]Rule(nil), cfg.Policy.Rules...),
		silent:     silent,
		tokenSum:   sha256.Sum256([]byte(cfg.Token)),
		resolver:   cfg.Resolver,
		dial:       cfg.Dial,
		onBlock:    cfg.OnBlocked,
		tunnelIdle: tunnelIdleTimeout,
		tunnels:    make(map[*tunnel]struct{}),
	}
	for _, r := range p.rules {
		if r.IP.IsValid() || r.Prefix.IsValid() {
			p.ipRules = append(p.ipRules, r)
		}
	}
	for _, a := range cfg.Self {
		p.self = append(p.self, a.Unmap().WithZone(""))
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
	quiet := log.New(io.Discard, "", 0)
	p.forward = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      p.transport,
		ErrorLog:       quiet,
		ModifyResponse: refuseSwitch,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "sandkeep egress: upstream failed", http.StatusBadGateway)
		},
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
	tunnels := make([]*tunnel, 0, len(p.tunnels))
	for t := range p.tunnels {
		tunnels = append(tunnels, t)
	}
	p.mu.Unlock()

	p.cancel()
	err := p.srv.Close()
	for _, t := range tunnels {
		t.close()
	}
	p.wg.Wait()
	p.transport.CloseIdleConnections()
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
	if !p.authorized(r.Header.Get("Proxy-Authorization")) {
		w.Header().Add("Proxy-Authenticate", `Bearer realm="sandkeep"`)
		w.Header().Add("Proxy-Authenticate", `Basic realm="sandkeep"`)
		http.Error(w, "sandkeep egress: proxy authentication required", http.StatusProxyAuthRequired)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()
	if r.Method == http.MethodConnect {
		p.serveConnect(ctx, w, r)
		return
	}
	p.serveForward(ctx, w, r)
}

// authorized reports whether h carries the token, as "Bearer <token>" or "Basic base64(user:token)". Both
// sides are hashed first so the comparison takes the same time whatever the length of what was sent.
func (p *Proxy) authorized(h string) bool {
	scheme, cred, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok {
		return false
	}
	cred = strings.TrimSpace(cred)
	var got string
	switch {
	case strings.EqualFold(scheme, "Bearer"):
		got = cred
	case strings.EqualFold(scheme, "Basic"):
		b, err := base64.StdEncoding.DecodeString(cred)
		if err != nil {
			return false
		}
		_, pass, ok := strings.Cut(string(b), ":")
		if !ok {
			return false
		}
		got = pass
	default:
		return false
	}
	sum := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(sum[:], p.tokenSum[:]) == 1
}

// verdict is the decision on one target.
type verdict struct {
	status int   // 0: allowed; else the status to refuse with
	block  Block // the refusal, when status is 400 or 403
	silent bool  // refused without an event
	host   string
	addrs  []netip.AddrPort // allowed: the checked addresses, to dial in this order and no other
}

// decide applies the policy to host (as the client wrote it, without its port) and port: the name against
// the rules, then every address it resolves to against the refused address classes, which only an IP or
// CIDR rule unlocks. It resolves at most once and returns the addresses it checked.
func (p *Proxy) decide(ctx context.Context, rawHost string, port uint16) verdict {
	name, ip, isIP, err := NormalizeHost(rawHost)
	if err != nil {
		return p.refuse(http.StatusBadRequest, Block{Host: cut(rawHost), Port: port, Reason: ReasonInvalidHost})
	}
	b := Block{Host: name, Port: port}
	if r, _ := match(p.silent, name, ip, isIP, port); r != nil {
		b.Reason = ReasonSilent
		return verdict{status: http.StatusForbidden, block: b, silent: true}
	}
	if p.mode == ModeNone {
		b.Reason = ReasonModeNone
		return p.refuse(http.StatusForbidden, b)
	}
	switch r, ok := match(p.rules, name, ip, isIP, port); {
	case r != nil && !ok:
		b.Reason, b.Rule = ReasonRule, r.String()
		return p.refuse(http.StatusForbidden, b)
	case r == nil && p.mode == ModeAllowlist:
		b.Reason = ReasonUnlisted
		return p.refuse(http.StatusForbidden, b)
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
			return p.refuse(http.StatusForbidden, b)
		}
		r, ok := MatchAddr(p.ipRules, a, port)
		if r != nil && !ok {
			b.Reason, b.Rule = ReasonRule, r.String()
			return p.refuse(http.StatusForbidden, b)
		}
		if class := classify(a, p.self); class != "" && r == nil {
			b.Reason = class
			return p.refuse(http.StatusForbidden, b)
		}
		checked = append(checked, netip.AddrPortFrom(a.WithZone(""), port))
	}
	return verdict{host: name, addrs: checked}
}

// refuse reports b (unless nobody listens) and returns the refusal.
func (p *Proxy) refuse(status int, b Block) verdict {
	if p.onBlock != nil {
		p.onBlock(b)
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
		respond(w, p.refuse(http.StatusBadRequest, Block{Host: cut(target), Reason: ReasonInvalidHost}))
		return
	}
	if port == 0 {
		badRequest(w, "CONNECT needs host:port")
		return
	}
	v := p.decide(ctx, host, port)
	if v.status != 0 {
		respond(w, v)
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
	if !p.track(t) {
		t.close()
		return
	}
	defer p.untrack(t)
	_ = client.SetDeadline(time.Now().Add(headerTimeout))
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		t.close()
		return
	}
	// Bytes the client sent after its request (a pipelined TLS hello) are in brw's buffer, not the socket.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		_ = up.SetWriteDeadline(time.Now().Add(headerTimeout))
		if _, err := up.Write(b); err != nil {
			t.close()
			return
		}
	}
	t.run(&p.wg)
}

// track registers an open tunnel so Close can end it; false when the proxy is already closed.
func (p *Proxy) track(t *tunnel) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
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
	idle             time.Duration
	last             atomic.Int64 // unix nanoseconds of the last byte read from either end
	once             sync.Once
}

// run copies both ways, one direction on a goroutine counted in wg, and returns when both have ended.
func (t *tunnel) run(wg *sync.WaitGroup) {
	t.touch()
	deadline := time.Time{}
	if t.idle > 0 {
		deadline = time.Now().Add(t.idle)
	}
	_ = t.client.SetReadDeadline(deadline)
	_ = t.upstream.SetReadDeadline(deadline)
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		_, _ = io.Copy(idleWriter{t.upstream, t}, idleReader{t.client, t})
		t.close()
	}()
	_, _ = io.Copy(idleWriter{t.client, t}, idleReader{t.upstream, t})
	t.close()
	<-done
}

func (t *tunnel) touch() { t.last.Store(time.Now().UnixNano()) }

// close closes both ends, once.
func (t *tunnel) close() {
	t.once.Do(func() {
		_ = t.client.Close()
		_ = t.upstream.Close()
	})
}

// idleReader reads from one end of a tunnel and fails only when the whole tunnel, both directions, has been
// idle for t.idle: a long one-way download keeps the quiet direction open.
type idleReader struct {
	c net.Conn
	t *tunnel
}

func (r idleReader) Read(b []byte) (int, error) {
	for {
		n, err := r.c.Read(b)
		timeout := errors.Is(err, os.ErrDeadlineExceeded)
		if n > 0 {
			r.t.touch()
			if timeout {
				err = nil
			}
			return n, err
		}
		if !timeout || r.t.idle <= 0 {
			return 0, err
		}
		next := time.Unix(0, r.t.last.Load()).Add(r.t.idle)
		if !time.Now().Before(next) {
			return 0, err
		}
		_ = r.c.SetReadDeadline(next)
	}
}

// idleWriter writes to one end of a tunnel and fails when one write makes no progress for t.idle (the peer
// stopped reading), which ends the tunnel even when both ends are stuck writing.
type idleWriter struct {
	c net.Conn
	t *tunnel
}

func (w idleWriter) Write(b []byte) (int, error) {
	if w.t.idle > 0 {
		_ = w.c.SetWriteDeadline(time.Now().Add(w.t.idle))
	}
	return w.c.Write(b)
}

// forwardKey carries a forwarded request's checked target from serveForward to rewrite and dialForward.
type forwardKey struct{}

type forwardTarget struct {
	authority string           // the outbound URL's host[:port], normalised
	addrs     []netip.AddrPort // the checked addresses
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
		respond(w, p.refuse(http.StatusBadRequest, Block{Host: cut(r.URL.Host), Reason: ReasonInvalidHost}))
		return
	}
	explicit := port != 0
	if !explicit {
		port = 80
	}
	v := p.decide(ctx, host, port)
	if v.status != 0 {
		respond(w, v)
		return
	}
	authority := v.host
	if strings.Contains(authority, ":") {
		authority = "[" + authority + "]"
	}
	if explicit {
		authority += ":" + strconv.Itoa(int(port))
	}
	ctx = context.WithValue(ctx, forwardKey{}, forwardTarget{authority: authority, addrs: v.addrs})
	p.forward.ServeHTTP(w, r.WithContext(ctx))
}

// rewrite makes the outbound request: to the checked target, Host from the URL, without the proxy's
// credentials, forwarding headers or a protocol upgrade (hop-by-hop headers are already gone).
func rewrite(pr *httputil.ProxyRequest) {
	t, _ := pr.In.Context().Value(forwardKey{}).(forwardTarget)
	pr.Out.URL.Scheme = "http"
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

func refuseSwitch(res *http.Response) error {
	if res.StatusCode == http.StatusSwitchingProtocols {
		return errSwitch
	}
	return nil
}

// dialForward is the forwarding transport's dialer: it connects to the addresses serveForward checked, never
// to a name, so a pooled or new connection always goes where the policy allowed.
func (p *Proxy) dialForward(ctx context.Context, _, _ string) (net.Conn, error) {
	t, ok := ctx.Value(forwardKey{}).(forwardTarget)
	if !ok || len(t.addrs) == 0 {
		return nil, errors.New("egress proxy: forward dial without a checked address")
	}
	return p.dialChecked(ctx, t.addrs)
}
