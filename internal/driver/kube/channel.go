package kube

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// The agent channel over the pod network. A pod's agent (init, PID 1 of the sandbox container) dials the
// driver's channel listener and opens the connection with a hello (agentproto.Hello): the pod's name and the
// token the driver put in that pod's init container, which the agent read once and removed. The driver believes
// a connection only when the token is that pod's, the peer address is that pod's IP and the pod is one of this
// driver's sandboxes (owned by its record); everything else is closed unread. A command inside the pod shares
// the pod's IP but not the token. While a pod's connection is up, a second one for that pod is refused: the
// agent dials again only after every process of its last session is gone. A connection carries one command at a
// time (the agentproto wire); a command that finds it busy, or finds none within the wait, goes through the API
// server's exec instead.
const (
	TokenEnv    = "SANDKEEP_CHANNEL_TOKEN" // the init container's variable (cmd/sandkeep-agent names the same)
	TokenDir    = "/.sandkeep-token"       // the memory volume the token is written to and removed from
	TokenFile   = TokenDir + "/token"      // cmd/sandkeep-agent's defaultTokenFile
	tokenVolume = "sandkeep-token"
	helloWait   = time.Second // for a connection's hello: the agent sends it as it connects
	// Hellos read at once: in all; from one source address (a pod's commands share its IP, so one sandbox's
	// command can hold no more than this many); and from addresses the pod informer does not know, together.
	// A connection past a bound is closed at once: Accept never waits for a slot, so silent connections
	// cannot hold up another pod's hello (issue 22: 64 of them stalled every channel for the hello wait).
	maxHellos          = 256
	maxHellosPerSource = 4
	maxUnknownHellos   = 16
	channelWarm        = 50 * time.Millisecond // how long a warm command waits for the channel
	channelFresh       = 3 * time.Second       // ... after the driver started the pod: its agent is dialling
	freshFor           = 30 * time.Second
	acceptWait         = 2 * time.Second // for the agent to acknowledge a request
	refusalLogEvery    = 10 * time.Second
)

// ChannelStats count what the channel listener did, for tests and diagnostics.
type ChannelStats struct {
	Accepted  int // connections believed
	Refused   int // connections closed: bad hello, wrong token or address, unknown pod, a second connection
	Execs     int // commands run over the channel
	Fallbacks int // commands that went through the API server's exec while the channel was on
	Egress    int // egress connections handed to a pod's egress proxy
	// EgressRefused counts egress connections closed after a good hello: no proxy is served for the pod (no
	// command with a network is running there), or its backlog was full.
	EgressRefused int
}

type podTrust struct {
	owner types.UID // the record's UID: the sandbox's ID
	ip    string
	token []byte
}

type slot struct {
	owner   types.UID
	conn    *net.TCPConn
	busy    bool
	arrived chan struct{} // closed when a connection is installed; replaced after each
}

type chanServer struct {
	ln   *net.TCPListener
	addr string // what pods dial
	api  kubernetes.Interface
	ns   string
	log  *slog.Logger

	watchOnce sync.Once
	stop      chan struct{}                   // stops the pod informer
	factory   informers.SharedInformerFactory // nil until the first Start or hello

	mu         sync.Mutex
	slots      map[string]*slot
	trust      map[string]podTrust        // the running pods of this namespace, as the informer last saw them
	started    map[string]time.Time       // pods this driver started, by name: their first command waits longer
	egress     map[string]*egressListener // the pods whose egress proxy is served, by name (egress.go)
	stats      ChannelStats
	lastRefuse time.Time
	skipped    int
	closed     bool

	hellos        map[string]int // hellos being read, by source address (guarded by mu)
	hellosAll     int            // their sum
	hellosUnknown int            // those from addresses no known pod has
	wg            sync.WaitGroup
}

// listenChannel listens on listen; pods dial advertise (or the listener's address when listen names an IP).
func listenChannel(listen, advertise string, api kubernetes.Interface, ns string, log *slog.Logger) (*chanServer, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	if advertise == "" {
		tcp := ln.Addr().(*net.TCPAddr)
		if tcp.IP.IsUnspecified() {
			ln.Close()
			return nil, fmt.Errorf("listening on %s, pods need an address to dial: set %s", listen, EnvChannelAddr)
		}
		advertise = tcp.String()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &chanServer{ln: ln.(*net.TCPListener), addr: advertise, api: api, ns: ns, log: log, stop: make(chan struct{}),
		slots: map[string]*slot{}, trust: map[string]podTrust{}, started: map[string]time.Time{}, egress: map[string]*egressListener{},
		hellos: map[string]int{}}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func (s *chanServer) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: do not spin
			continue
		}
		ip := peerIP(c)
		known, ok := s.admitHello(ip)
		if !ok {
			s.refuse(c, "too many hellos at once from this address", "peer", ip)
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.helloDone(ip, known)
			s.handle(c)
		}()
	}
}

// peerIP is c's remote IP address, "" when it has none.
func peerIP(c *net.TCPConn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return ""
}

// admitHello takes a hello slot for a connection from ip, or reports that a bound is reached (the connection
// is then closed unread). known: ip is a pod's the informer saw, which do not share the unknown addresses' slots.
func (s *chanServer) admitHello(ip string) (known, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.trust {
		if t.ip == ip {
			known = true
			break
		}
	}
	if s.hellosAll >= maxHellos || s.hellos[ip] >= maxHellosPerSource || (!known && s.hellosUnknown >= maxUnknownHellos) {
		return known, false
	}
	s.hellos[ip]++
	s.hellosAll++
	if !known {
		s.hellosUnknown++
	}
	return known, true
}

// helloDone gives back the slot admitHello took.
func (s *chanServer) helloDone(ip string, known bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hellos[ip]--; s.hellos[ip] <= 0 {
		delete(s.hellos, ip)
	}
	s.hellosAll--
	if !known {
		s.hellosUnknown--
	}
}

// handle reads c's hello and installs c as its pod's channel, or closes it.
func (s *chanServer) handle(c *net.TCPConn) {
	_ = c.SetReadDeadline(time.Now().Add(helloWait))
	h, err := agentproto.ReadHello(c)
	if err != nil {
		s.refuse(c, "bad hello", "peer", c.RemoteAddr().String(), "err", err)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	ip := peerIP(c)
	owner, ok := s.believe(h, ip)
	clear(h.Token)
	if !ok {
		s.refuse(c, "not the pod's agent (token, address or pod)", "pod", h.Name, "peer", ip)
		return
	}
	_ = c.SetKeepAlive(true)
	_ = c.SetKeepAlivePeriod(15 * time.Second)
	if h.Egress {
		s.handEgress(h.Name, owner, c)
		return
	}
	_ = c.SetNoDelay(true)
	s.install(h.Name, owner, c)
}

// believe checks h against what the pod informer last saw of the pod. A hello that arrives before the informer
// saw the pod run is refused; the agent dials again within 200 ms.
func (s *chanServer) believe(h agentproto.Hello, ip string) (types.UID, bool) {
	s.watch()
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.trust[h.Name]
	if ok && t.ip != "" && t.ip == ip && subtle.ConstantTimeCompare(t.token, h.Token) == 1 {
		return t.owner, true
	}
	return "", false
}

// watch starts the informer of the namespace's sandbox pods (once): it keeps what a hello must match, and it
// drops a pod's connection as soon as the pod is being deleted, by sandkeep or behind its back, so that no
// command goes to a pod that the API server no longer runs.
func (s *chanServer) watch() {
	s.watchOnce.Do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			return
		}
		f := informers.NewSharedInformerFactoryWithOptions(s.api, 0, informers.WithNamespace(s.ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelManagedBy + "=" + ManagedBy }))
		inf := f.Core().V1().Pods().Informer()
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { s.observe(o) },
			UpdateFunc: func(_, o any) { s.observe(o) },
			DeleteFunc: func(o any) { s.gone(o) },
		})
		f.Start(s.stop)
		s.factory = f
	})
}

func (s *chanServer) observe(o any) {
	pod, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	t, ok := trustOf(pod)
	s.mu.Lock()
	defer s.mu.Unlock()
	if ok {
		s.trust[pod.Name] = t
		return
	}
	s.dropLocked(pod.Name) // pending (a new pod of that name), being deleted, or not a sandbox's
}

func (s *chanServer) gone(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	if pod, ok := o.(*corev1.Pod); ok {
		s.mu.Lock()
		s.dropLocked(pod.Name)
		s.mu.Unlock()
	}
}

// dropLocked forgets pod name's trust and closes its connection, busy or not: a command running over it ends
// with a broken channel, as it would have when the pod's processes die.
func (s *chanServer) dropLocked(name string) {
	delete(s.trust, name)
	if sl := s.slots[name]; sl != nil && sl.conn != nil {
		sl.conn.Close()
		sl.conn = nil
	}
}

// trustOf is what a hello for pod must match: its token (its init container's), its IP and its owner record.
func trustOf(pod *corev1.Pod) (podTrust, bool) {
	if pod.DeletionTimestamp != nil || pod.Status.PodIP == "" {
		return podTrust{}, false
	}
	var owner types.UID
	for _, o := range pod.OwnerReferences {
		if o.Kind == "ConfigMap" && o.Name == pod.Name {
			owner = o.UID
		}
	}
	if owner == "" {
		return podTrust{}, false
	}
	for _, c := range pod.Spec.InitContainers {
		if c.Name != InitName {
			continue
		}
		for _, e := range c.Env {
			if e.Name == TokenEnv && len(e.Value) >= agentproto.MinHelloToken {
				return podTrust{owner: owner, ip: pod.Status.PodIP, token: []byte(e.Value)}, true
			}
		}
	}
	return podTrust{}, false
}

func (s *chanServer) install(name string, owner types.UID, c *net.TCPConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return
	}
	sl := s.slots[name]
	if sl == nil {
		sl = &slot{arrived: make(chan struct{})}
		s.slots[name] = sl
	}
	if sl.conn != nil {
		if sl.busy || !peerGone(sl.conn) {
			s.refuseLocked(c, "a second connection while the pod's is up", "pod", name)
			return
		}
		sl.conn.Close()
	}
	sl.conn, sl.owner, sl.busy = c, owner, false
	s.stats.Accepted++
	close(sl.arrived)
	sl.arrived = make(chan struct{})
}

func (s *chanServer) refuse(c *net.TCPConn, why string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuseLocked(c, why, args...)
}

// refuseLocked closes c and logs, at most once per refusalLogEvery with a count of those left out.
func (s *chanServer) refuseLocked(c *net.TCPConn, why string, args ...any) {
	c.Close()
	s.stats.Refused++
	if now := time.Now(); now.Sub(s.lastRefuse) >= refusalLogEvery {
		s.log.Warn("agent channel: refused a connection: "+why, append(args, "refused_since_last_log", s.skipped)...)
		s.lastRefuse, s.skipped = now, 0
		return
	}
	s.skipped++
}

// started notes that the driver just started pod name: its first command waits longer for the channel.
func (s *chanServer) noteStarted(name string) {
	s.watch()
	s.mu.Lock()
	s.started[name] = time.Now()
	s.mu.Unlock()
}

// take returns pod name's connection for one command of the sandbox owner, waiting up to the channel wait; nil
// when there is none, it is busy, or it belongs to another sandbox of that name: the caller uses the API
// server's exec. The caller gives it back with release.
func (s *chanServer) take(ctx context.Context, name string, owner types.UID) *net.TCPConn {
	s.mu.Lock()
	wait := channelWarm
	if t, ok := s.started[name]; ok && time.Since(t) < freshFor {
		wait = channelFresh
	}
	s.mu.Unlock()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil
		}
		sl := s.slots[name]
		if sl == nil {
			sl = &slot{arrived: make(chan struct{})}
			s.slots[name] = sl
		}
		if sl.busy {
			s.stats.Fallbacks++
			s.mu.Unlock()
			return nil
		}
		if sl.conn != nil {
			if t, ok := s.trust[name]; !ok || t.owner != owner {
				// The informer saw the pod go (or it is another sandbox's): never the channel of a pod the API
				// server no longer runs. The exec path finds out what happened.
				s.stats.Fallbacks++
				s.mu.Unlock()
				return nil
			}
			if sl.owner == owner && idleAlive(sl.conn) {
				sl.busy = true
				s.stats.Execs++
				delete(s.started, name)
				c := sl.conn
				s.mu.Unlock()
				return c
			}
			if sl.owner == owner { // gone or garbled: the agent dials again
				sl.conn.Close()
				sl.conn = nil
			}
		}
		arrived := sl.arrived
		s.mu.Unlock()
		select {
		case <-arrived:
		case <-timer.C:
			s.mu.Lock()
			s.stats.Fallbacks++
			s.mu.Unlock()
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// release gives c back after a command; a broken one is closed and forgotten.
func (s *chanServer) release(name string, c *net.TCPConn, broken bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.slots[name]
	if sl == nil || sl.conn != c {
		c.Close()
		return
	}
	sl.busy = false
	if broken {
		c.Close()
		sl.conn = nil
	}
}

// forget drops pod name's connection (the pod is being deleted).
func (s *chanServer) forget(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.slots[name]; sl != nil && !sl.busy {
		if sl.conn != nil {
			sl.conn.Close()
		}
		delete(s.slots, name)
	}
	delete(s.started, name)
}

func (s *chanServer) snapshot() ChannelStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

func (s *chanServer) close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for _, sl := range s.slots {
		if sl.conn != nil {
			sl.conn.Close()
		}
	}
	for _, l := range s.egress {
		l.shut()
	}
	clear(s.egress)
	f := s.factory
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	close(s.stop)
	if f != nil {
		f.Shutdown()
	}
	return err
}

// idleAlive: between commands the agent sends nothing, so a peek that would block means alive; EOF means gone;
// bytes mean a broken protocol.
func idleAlive(c syscall.Conn) bool {
	alive := false
	peek(c, func(n int, err error) { alive = n < 0 && (err == unix.EAGAIN || err == unix.EWOULDBLOCK) })
	return alive
}

// peerGone: EOF or an error on a peek; bytes waiting, or nothing yet, mean a peer that is still there.
func peerGone(c syscall.Conn) bool {
	gone := true
	peek(c, func(n int, err error) {
		switch {
		case err == unix.EAGAIN || err == unix.EWOULDBLOCK || err == unix.EINTR:
			gone = false
		case err == nil:
			gone = n == 0
		}
	})
	return gone
}

func peek(c syscall.Conn, f func(n int, err error)) {
	raw, err := c.SyscallConn()
	if err != nil {
		f(0, err)
		return
	}
	if cerr := raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, rerr := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		f(n, rerr)
	}); cerr != nil {
		f(0, cerr)
	}
}
