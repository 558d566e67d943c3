package lifecycle

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/channel"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// The egress path of a sandbox: it has no network of its own (mode none), and its init forwards EgressListen, on
// the sandbox's loopback, to the key's proxy socket in the channel directory, where this process serves the
// key's egress.Proxy. Commands get the proxy in HTTP(S)_PROXY, with their own token as the password: each
// command is a session of the proxy (egress.Proxy.Begin), with its own policy and a token valid while it runs.
const (
	// EgressListen is the proxy's address inside every sandbox.
	EgressListen = "127.0.0.1:3128"
	// caBundleName is the CA bundle's file in the channel directory, written when TLS inspection is on.
	caBundleName = "ca-bundle.pem"
	// CABundlePath is where a command finds it.
	CABundlePath = channel.MountPoint + "/" + caBundleName
	// AgentCABundlePath is where a command finds it on a driver that serves the egress endpoint itself
	// (driver.EgressListener: kubernetes), which has no channel directory: the agent writes it (put-file) on the
	// secrets tmpfs, from which the secret files' checks keep every secret away (checkSecrets).
	AgentCABundlePath = spec.SecretsDir + "/.sandkeep/" + caBundleName
	// noProxy: the sandbox's own loopback is never proxied.
	noProxy = "localhost,127.0.0.1,::1"
)

// keyEgress is one key's proxy, served by this process for as long as the key's sandbox is known to it.
type keyEgress struct {
	proxy        *egress.Proxy
	ln           net.Listener      // the channel directory's egress socket, or the driver's (driver.EgressListener)
	mu           sync.Mutex        // guards placeholders, caGen, rootsOf and roots: concurrent sessions read them
	placeholders map[string]string // credential name -> its placeholder, stable for the proxy's life
	caGen        uint64            // the CA generation written to the bundle file; 0: none
	rootsOf      string            // the container whose image roots the bundle holds
	roots        []byte            // those roots (PEM), read once per container
	served       chan struct{}     // closed when Serve returns
	owner        *net.UnixListener // other processes' sessions (egressowner.go); nil without a channel directory
	ownerDone    chan struct{}     // closed when serveOwner returns
}

// egressFor brings key's proxy up with pol as the policy for the command about to run, under a token of the
// command's own, routes its refusals to ctx's sink, and returns the environment the command needs to use it.
// The caller holds key's gate and calls the returned release when the command is over: release ends the
// session, so the token stops working and whatever the command opened through the proxy is closed. A command
// without a network (mode none) gets no proxy environment, and the key's proxy, when there is one, has no
// session while it runs: nothing reaches it with an earlier command's token or policy.
//
// block says the command or its run named a network block (ExecRequest.NetworkBlock): a none asked for must then
// be true, and a driver whose isolation rests on a probe (driver.NoNetworkChecker: kubernetes) refuses it where
// it is not proven.
func (m *Manager) egressFor(ctx context.Context, key identity.Key, sb *driver.Sandbox, pol *egress.Policy, block bool) (env []string, release func(), err error) {
	release = func() {}
	if noNetwork(pol) {
		m.endEgress(key)
		return nil, release, m.proveNoNetwork(ctx, sb, block)
	}
	ke, dir, err := m.keyProxy(ctx, key, sb)
	if errors.Is(err, channel.ErrInUse) {
		// Another process of the home serves this sandbox's network: the command's session goes there.
		return m.egressThroughOwner(ctx, key, pol, err)
	}
	if err != nil || ke == nil {
		return nil, release, err
	}
	p, env := ke.withPlaceholders(pol)
	token, err := newToken()
	if err != nil {
		return nil, release, err
	}
	tally := newBlockTally(func(ev events.NetworkBlocked) { m.emit(ctx, events.NameNetworkBlocked, ev) })
	ke.proxy.SetOnBlocked(func(b egress.Block) { tally.add(blockedEvent(key, b)) })
	ke.proxy.SetOnReflected(m.reflectedSink(ctx, key))
	idle := func() {
		ke.proxy.End()
		if rep, ok := tally.flush(); ok {
			rep.Sandbox, rep.Key = key.ContainerName(), key.Short()
			m.emit(ctx, events.NameNetworkBlockedRepeat, rep)
		}
		ke.proxy.SetOnBlocked(m.blockedSink(context.Background(), key))
		ke.proxy.SetOnReflected(m.reflectedSink(context.Background(), key))
	}
	if err := ke.proxy.Begin(p, token); err != nil {
		idle()
		return nil, release, fault.Wrap(err, fault.NetworkInvalid, "check the network block", "network policy refused")
	}
	release = idle
	env = append(env, proxyEnv(token)...)
	if ca, gen := ke.proxy.CA(); ca != nil {
		bundle := CABundlePath
		if dir == "" {
			err = m.placeBundle(ctx, key, sb, ke, ca, gen)
			bundle = AgentCABundlePath
		} else {
			err = m.writeBundle(sb, ke, dir, ca, gen)
		}
		if err != nil {
			release()
			return nil, func() {}, err
		}
		env = append(env, bundleEnv(bundle)...)
	}
	return env, release, nil
}

// keyProxy brings up key's proxy, listening where sb's driver reaches it: the channel directory's socket (dir),
// or an endpoint the driver serves (driver.EgressListener, dir ""). A nil proxy and no error: the driver cannot
// confine a network (the host passthrough), so there is nothing to enforce. channel.ErrInUse: another process
// of the home serves it. Under gVisor there is no way to it, refused.
func (m *Manager) keyProxy(ctx context.Context, key identity.Key, sb *driver.Sandbox) (ke *keyEgress, dir string, err error) {
	if m.cfg.Runtime == RuntimeGVisor {
		return nil, "", fault.New(fault.EgressUnavailable,
			"give commands of sandboxes under runsc network mode none, or run networked sandboxes under runc (docs/SECURITY.md, \"gVisor\")",
			"a sandbox under gVisor (runsc) has no way to the egress proxy: its socket is a host Unix socket, which runsc refuses without --host-uds, and with it every process of the sandbox would reach the host as the same gofer process")
	}
	dir = m.channelDir(key)
	el, netEgress := m.drv.(driver.EgressListener)
	if dir == "" && !netEgress {
		// The run's sandbox_skipped already says the command is not isolated.
		m.cfg.Logger.Warn("network policy not applied: the driver has no sandbox network", "driver", m.drv.Name(), "key", key.Short())
		return nil, "", nil
	}
	listen := func() (net.Listener, error) { return m.listenSide(key, dir) }
	if dir == "" {
		// The driver serves the sandbox's egress endpoint itself (kubernetes: over the pod network); it refuses
		// where it cannot confine the sandbox to it, and the command does not run.
		listen = func() (net.Listener, error) { return el.ListenEgress(ctx, sb) }
	}
	ke, err = m.egressOf(key, listen)
	return ke, dir, err
}

// proxyEnv points a command's HTTP clients at the key's proxy under its session's token.
func proxyEnv(token string) []string {
	u := "http://sandkeep:" + token + "@" + EgressListen
	return []string{"HTTP_PROXY=" + u, "HTTPS_PROXY=" + u, "http_proxy=" + u, "https_proxy=" + u,
		"NO_PROXY=" + noProxy, "no_proxy=" + noProxy}
}

// bundleEnv points a command's TLS clients at the CA bundle at path (inside the sandbox).
func bundleEnv(path string) []string {
	var env []string
	for _, k := range []string{"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"} {
		env = append(env, k+"="+path)
	}
	return env
}

// withPlaceholders is pol with the key's placeholder for each credential (stable for the proxy's life: a
// credential is the same placeholder in every command), and the environment that hands them to the command.
func (ke *keyEgress) withPlaceholders(pol *egress.Policy) (egress.Policy, []string) {
	ke.mu.Lock()
	defer ke.mu.Unlock()
	p := *pol
	p.Credentials = make([]egress.Credential, len(pol.Credentials))
	var env []string
	for i, c := range pol.Credentials {
		ph, ok := ke.placeholders[c.Name]
		if !ok {
			ph = egress.NewPlaceholder(c.Name)
			ke.placeholders[c.Name] = ph
		}
		c.Placeholder = ph
		p.Credentials[i] = c
		env = append(env, c.Name+"="+ph)
	}
	return p, env
}

// endEgress ends the session of key's proxy, if this process serves one: for a command without a network.
func (m *Manager) endEgress(key identity.Key) {
	m.mu.Lock()
	ke := m.egress[key.Hex()]
	m.mu.Unlock()
	if ke != nil {
		ke.proxy.End()
	}
}

// listenSide listens on the egress socket of key's channel directory dir, which the sandbox's init dials.
func (m *Manager) listenSide(key identity.Key, dir string) (net.Listener, error) {
	ln, err := channel.ListenSide(dir, channel.EgressSocketName, m.verifier(func() identity.Key { return key }), m.cfg.Logger)
	if errors.Is(err, channel.ErrInUse) {
		return nil, fault.Wrap(err, fault.EgressUnavailable,
			"run the command through the sandkeep process that serves this user (e.g. the server), or stop it",
			"another sandkeep process serves the network of sandbox %s", key.ContainerName())
	}
	if err != nil {
		return nil, fault.Wrap(err, fault.EgressUnavailable, "check that the state home is writable", "cannot start the egress proxy")
	}
	return ln, nil
}

// egressOf returns key's proxy, starting it on listen's listener when this process has none yet. The caller
// holds key's gate (shared, by a concurrent command or process: egressNew keeps two from starting one); listen
// runs outside m.mu (a driver's
// may take seconds: the kubernetes driver's first one probes the cluster).
func (m *Manager) egressOf(key identity.Key, listen func() (net.Listener, error)) (*keyEgress, error) {
	m.egressNew.Lock() // concurrent commands and processes hold the gate shared: one of them starts the proxy
	defer m.egressNew.Unlock()
	m.mu.Lock()
	ke, ok := m.egress[key.Hex()]
	m.mu.Unlock()
	if ok {
		return ke, nil
	}
	ln, err := listen()
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// A token nobody is given: the proxy accepts nothing until a command's session begins.
	token, err := newToken()
	if err != nil {
		ln.Close()
		return nil, err
	}
	proxy, err := egress.New(egress.Config{
		Policy:        egress.Policy{Mode: egress.ModeNone},
		Token:         token,
		Resolver:      m.cfg.EgressResolver,
		Dial:          m.cfg.EgressDial,
		UpstreamRoots: m.cfg.EgressUpstreamRoots,
		Self:          hostAddrs(),
		Refused:       m.cfg.EgressRefused,
		OnBlocked:     m.blockedSink(context.Background(), key),
	})
	if err != nil {
		ln.Close()
		return nil, fault.Wrap(err, fault.Internal, "", "cannot create the egress proxy")
	}
	proxy.End()
	ke = &keyEgress{proxy: proxy, ln: ln, placeholders: map[string]string{}, served: make(chan struct{})}
	go func() {
		defer close(ke.served)
		if err := proxy.Serve(ln); err != nil {
			m.cfg.Logger.Warn("egress proxy stopped", "key", key.Short(), "err", err)
		}
	}()
	if dir := m.channelDir(key); dir != "" {
		// Other processes of the home run their commands' sessions through this proxy (egressowner.go).
		if ke.owner, err = m.listenOwner(key); err != nil {
			m.cfg.Logger.Warn("egress owner socket unavailable: other processes' networked commands of this key are refused", "key", key.Short(), "err", err)
			ke.owner = nil
		} else {
			ke.ownerDone = make(chan struct{})
			go m.serveOwner(key, ke, dir)
		}
	}
	m.egress[key.Hex()] = ke
	return ke, nil
}

// blockedSink reports the proxy's refusals as network_blocked events: to ctx's sink (the command's run) while a
// command runs, else to the manager's.
func (m *Manager) blockedSink(ctx context.Context, key identity.Key) func(egress.Block) {
	return func(b egress.Block) { m.emit(ctx, events.NameNetworkBlocked, blockedEvent(key, b)) }
}

func blockedEvent(key identity.Key, b egress.Block) events.NetworkBlocked {
	ev := events.NetworkBlocked{Host: b.Host, Port: int(b.Port), Rule: b.Rule, Reason: b.Reason,
		Sandbox: key.ContainerName(), Key: key.Short()}
	if b.Addr.IsValid() {
		ev.Addr = b.Addr.String()
	}
	return ev
}

// maxBlockKinds caps the network_blocked events one command records: one per host, port, reason and rule, up to
// this many; the rest are counted in its network_blocked_repeats.
const maxBlockKinds = 32

// blockTally aggregates one command's refusals so that a command refused in a loop costs the store a bounded
// number of writes: the first refusal of each kind is emitted at once (the caller sees why as it happens),
// repeats are counted, kinds past maxBlockKinds only counted; flush gives the counts for one event at the end.
type blockTally struct {
	emit func(events.NetworkBlocked)

	mu      sync.Mutex
	counts  map[events.BlockedCount]int // kind (Count zero) -> repeats after the first
	order   []events.BlockedCount       // kinds in the order first seen
	dropped int
}

func newBlockTally(emit func(events.NetworkBlocked)) *blockTally {
	return &blockTally{emit: emit, counts: map[events.BlockedCount]int{}}
}

func (t *blockTally) add(ev events.NetworkBlocked) {
	kind := events.BlockedCount{Host: ev.Host, Port: ev.Port, Reason: ev.Reason, Rule: ev.Rule}
	t.mu.Lock()
	n, seen := t.counts[kind]
	first := false
	switch {
	case seen:
		t.counts[kind] = n + 1
	case len(t.order) >= maxBlockKinds:
		t.dropped++
	default:
		t.counts[kind] = 0
		t.order = append(t.order, kind)
		first = true
	}
	t.mu.Unlock()
	if first {
		t.emit(ev)
	}
}

// flush returns the repeats and the dropped count, and resets them; ok is false when there were none.
func (t *blockTally) flush() (events.NetworkBlockedRepeats, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var rep events.NetworkBlockedRepeats
	for _, k := range t.order {
		if n := t.counts[k]; n > 0 {
			t.counts[k] = 0
			k.Count = n
			rep.Repeats = append(rep.Repeats, k)
		}
	}
	rep.Dropped, t.dropped = t.dropped, 0
	return rep, len(rep.Repeats) > 0 || rep.Dropped > 0
}

// reflectedSink reports the proxy's scrubbed reflections as credential_reflected events, like blockedSink.
func (m *Manager) reflectedSink(ctx context.Context, key identity.Key) func(egress.Reflection) {
	return func(r egress.Reflection) {
		m.emit(ctx, events.NameCredentialReflected, events.CredentialReflected{Credential: r.Credential, Host: r.Host,
			Port: int(r.Port), Where: r.Where, Sandbox: key.ContainerName(), Key: key.Short()})
	}
}

// writeBundle writes the CA bundle the sandbox trusts when the proxy's CA changed: the proxy's CA first, then the
// image's own roots, so clients that replace their trust store with SSL_CERT_FILE still trust what they did.
func (m *Manager) writeBundle(sb *driver.Sandbox, ke *keyEgress, dir string, ca []byte, gen uint64) error {
	ke.mu.Lock()
	defer ke.mu.Unlock()
	if gen == ke.caGen && sb.ID == ke.rootsOf {
		return nil
	}
	if sb.ID != ke.rootsOf {
		ke.roots, ke.rootsOf = m.imageRoots(sb), sb.ID
	}
	bundle := append(slices.Clip(ca), ke.roots...)
	if err := replaceFile(filepath.Join(dir, caBundleName), bytes.NewReader(bundle), 0o644); err != nil {
		return fault.Wrap(err, fault.EgressUnavailable, "check that the state home is writable", "cannot write the sandbox's CA bundle")
	}
	ke.caGen = gen
	return nil
}

// placeBundle puts the CA bundle into sb through its agent (`sandkeep-agent put-file`, as secret files go) at
// AgentCABundlePath, when the proxy's CA changed or sb's pod is a new one (a pod's tmpfs starts empty: the
// kubernetes driver gives a recreated pod a new StartedAt). The bundle holds the proxy's CA only: the driver does
// not read the image's trust store. The caller holds key's gate.
func (m *Manager) placeBundle(ctx context.Context, key identity.Key, sb *driver.Sandbox, ke *keyEgress, ca []byte, gen uint64) error {
	stamp := sb.ID + "@" + sb.StartedAt.UTC().Format(time.RFC3339Nano)
	if gen == ke.caGen && stamp == ke.rootsOf {
		return nil
	}
	var diag bytes.Buffer
	req := ExecRequest{
		Argv:  []string{driver.AgentPath, "put-file", AgentCABundlePath, "0444"},
		Stdin: bytes.NewReader(ca), Stdout: &diag, Stderr: &diag, StdoutLimit: helperOutputLimit, StderrLimit: helperOutputLimit,
		Timeout: secretPutTimeout,
	}
	preq, err := m.agentRequest(req)
	if err != nil {
		return err
	}
	res, err := m.execIn(ctx, key, sb, preq, driver.Output{Stdin: req.Stdin, Stdout: &diag, Stderr: &diag})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || res.TimedOut || res.StartError != "" {
		return fault.New(fault.EgressUnavailable, "check the sandbox's "+spec.SecretsDir+" (the posture's tmpfs) and the agent image; the command did not run",
			"the proxy's CA bundle could not be placed in sandbox %s: %s", sb.Name, helperFailure(res, diag.Bytes(), nil))
	}
	ke.caGen, ke.rootsOf, ke.roots = gen, stamp, nil
	return nil
}

// imageRoots is the trust store of sb's image, when the driver can read it; nil otherwise.
func (m *Manager) imageRoots(sb *driver.Sandbox) []byte {
	r, ok := m.drv.(interface {
		ReadRoots(ctx context.Context, name string) ([]byte, error)
	})
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := r.ReadRoots(ctx, sb.ID)
	if err != nil {
		m.cfg.Logger.Debug("image roots unavailable", "sandbox", sb.Name, "err", err)
		return nil
	}
	return b
}

// dropEgress stops key's proxy (the sandbox is stopped or gone).
func (m *Manager) dropEgress(key identity.Key) {
	m.mu.Lock()
	ke := m.egress[key.Hex()]
	delete(m.egress, key.Hex())
	m.mu.Unlock()
	if ke != nil {
		ke.close()
	}
}

func (ke *keyEgress) close() {
	if ke.owner != nil {
		ke.owner.Close()
		<-ke.ownerDone
	}
	ke.proxy.Close()
	ke.ln.Close()
	<-ke.served
}

// closeEgress stops every proxy of this process.
func (m *Manager) closeEgress() {
	m.mu.Lock()
	all := m.egress
	m.egress = map[string]*keyEgress{}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, ke := range all {
		wg.Go(ke.close)
	}
	wg.Wait()
}

func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("egress token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// hostAddrs are this host's own addresses: the proxy refuses them as targets (they reach the host's services)
// unless a rule names them.
func hostAddrs() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		// Loopback is a refused class of its own, named as such in events.
		if p, err := netip.ParsePrefix(a.String()); err == nil && !p.Addr().IsLoopback() {
			out = append(out, p.Addr())
		}
	}
	return out
}

// proveNoNetwork: a command without a network whose caller named a block must have none in fact, where the
// driver's isolation rests on a probe (driver.NoNetworkChecker: kubernetes).
func (m *Manager) proveNoNetwork(ctx context.Context, sb *driver.Sandbox, block bool) error {
	if nc, ok := m.drv.(driver.NoNetworkChecker); ok && block {
		return nc.CheckNoNetwork(ctx, sb)
	}
	return nil
}
