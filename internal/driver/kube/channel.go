package kube

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/channel"
	"github.com/sandkeep/sandkeep/internal/driver"
)

// The agent channel over the pod network. A pod's agent (init, PID 1 of the sandbox container) dials the
// driver's channel listener and opens the connection with a hello (agentproto.Hello): the pod's name and the
// token the driver put in that pod's init container, which the agent read once and removed. The driver believes
// a connection only when the token is that pod's, the peer address is that pod's IP and the pod is one of this
// driver's sandboxes (owned by its record); everything else is closed unread. A command inside the pod shares
// the pod's IP but not the token. While a pod's connection is up, a second one for that pod is refused: the
// agent dials again only after every process of its last session is gone. A believed connection is installed in
// the pod's channel.Slot, the session side the Docker driver's channel uses too: after its hello it carries the
// same multiplexed wire (commands, concurrent commands, processes, forwarded streams). The driver offers the
// slot (AgentChannel); the lifecycle decides whether a command goes over it or through the API server's exec.
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
	refusalLogEvery    = 10 * time.Second
)

// ChannelStats count what the channel listener did, for tests and diagnostics.
type ChannelStats struct {
	Accepted int // connections believed
	Refused  int // connections closed: bad hello, wrong token or address, unknown pod, a second connection
	Egress   int // egress connections handed to a pod's egress proxy
	// EgressRefused counts egress connections closed after a good hello: no proxy is served for the pod (no
	// command with a network is running there), or its backlog was full.
	EgressRefused int
}

type podTrust struct {
	owner types.UID // the record's UID: the sandbox's ID
	ip    string
	token []byte
}

// podSlot is a pod's channel: the sandbox (its record's UID) it belongs to and its session side.
type podSlot struct {
	owner types.UID
	slot  *channel.Slot
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
	slots      map[string]*podSlot
	trust      map[string]podTrust        // the running pods of this namespace, as the informer last saw them
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
		slots: map[string]*podSlot{}, trust: map[string]podTrust{}, egress: map[string]*egressListener{},
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
// with a broken channel, as it would have when the pod's processes die. So no command goes to a pod the API
// server no longer runs.
func (s *chanServer) dropLocked(name string) {
	delete(s.trust, name)
	if ps := s.slots[name]; ps != nil {
		ps.slot.Drop()
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
	ps := s.slotLocked(name, owner)
	if ps.slot.Up() || !ps.slot.Install(c) {
		s.refuseLocked(c, "a second connection while the pod's is up", "pod", name)
		return
	}
	s.stats.Accepted++
}

// slotLocked returns pod name's slot for the sandbox owner, making it when there is none; a slot of another
// sandbox of that name (removed and made again) is closed and replaced.
func (s *chanServer) slotLocked(name string, owner types.UID) *podSlot {
	ps := s.slots[name]
	if ps != nil && ps.owner == owner {
		return ps
	}
	if ps != nil {
		ps.slot.Close()
	}
	ps = &podSlot{owner: owner, slot: channel.NewSlot()}
	s.slots[name] = ps
	return ps
}

// HasAgentChannel reports whether the driver serves its pods' agent channels (ChannelListen is set).
func (d *Driver) HasAgentChannel() bool { return d.ch != nil }

// AgentChannel returns the channel of sb's pod (driver.AgentChannels), nil when the driver has no channel.
func (d *Driver) AgentChannel(sb *driver.Sandbox) *channel.Slot {
	if d.ch == nil {
		return nil
	}
	s := d.ch
	s.watch()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	return s.slotLocked(sb.Name, types.UID(sb.ID)).slot
}

var _ driver.AgentChannels = (*Driver)(nil)

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

// forget drops pod name's connection: the pod is being deleted. remove: the sandbox goes too, and its slot.
func (s *chanServer) forget(name string, remove bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ps := s.slots[name]
	if ps == nil {
		return
	}
	if remove {
		ps.slot.Close()
		delete(s.slots, name)
		return
	}
	ps.slot.Drop()
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
	for _, ps := range s.slots {
		ps.slot.Close()
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
