package lifecycle

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/sandkeep/sandkeep/internal/channel"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Host services: an operator's host endpoint (an MCP server, an ask-the-user service; Config.HostServices) is
// offered inside the sandbox of a run whose template lists it. The sandbox keeps no network: its init listens on
// a loopback address per service (ServicePortBase + the service's index, --service) and hands each connection to
// the host over the socket svc-PORT.sock in the key's channel directory, exactly as it carries egress
// (cmd/sandkeep-agent/service_linux.go). This process serves those sockets (SO_PEERCRED: the sandbox's PID 1
// only) with a reverse proxy to the operator's URL that lets a request through only with the bearer token of a
// run one of whose commands has the service open now (ExecRequest.Services), compared in constant time. The
// token never reaches the operator's endpoint.
const (
	// ServicePortBase is the first host service's port inside every sandbox; the i-th (by name) is base+i.
	ServicePortBase = 3130
	// MaxHostServices bounds Config.HostServices (cmd/sandkeep-agent names the same bound).
	MaxHostServices = 16
	// serviceProxyTimeout bounds waiting for the operator's endpoint to answer a request's headers.
	serviceHeaderTimeout = 5 * time.Minute
)

// HostService is one operator host endpoint that templates may offer to their runs' sandboxes.
type HostService struct {
	Name string   // [a-z0-9_-], 1..32 bytes: SANDKEEP_SERVICE_<NAME>_URL upper-cases it
	URL  *url.URL // http or https, on any host the operator names (typically 127.0.0.1)
}

// ServiceGrant opens a host service for one command: the service's Name and its run's bearer Token.
type ServiceGrant struct {
	Name  string
	Token string
}

var serviceName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// ParseHostService checks one operator host service: its name and URL.
func ParseHostService(name, rawURL string) (HostService, error) {
	if !serviceName.MatchString(name) {
		return HostService{}, fault.New(fault.InvalidArgument, "name host services with lower-case letters, digits, '-' and '_' (at most 32)",
			"host service name %q is not valid", name)
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return HostService{}, fault.New(fault.InvalidArgument, "write the service's url as http://127.0.0.1:PORT[/path]",
			"host service %s: url %q is not an http(s) URL with a host (and no user, query or fragment)", name, rawURL)
	}
	return HostService{Name: name, URL: u}, nil
}

// ServiceEnvName is the prefix of a service's two variables: SANDKEEP_SERVICE_<NAME>_.
func ServiceEnvName(name string) string {
	return "SANDKEEP_SERVICE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "_"
}

// ServiceAddress is where a command inside the sandbox reaches the i-th host service.
func ServiceAddress(i int) string { return "127.0.0.1:" + strconv.Itoa(ServicePortBase+i) }

// serviceIndex is the index of the host service name in Config.HostServices, or -1.
func (c *Config) serviceIndex(name string) int {
	for i, s := range c.HostServices {
		if s.Name == name {
			return i
		}
	}
	return -1
}

// checkHostServices refuses a list that is too long, unsorted or repeats a name (the index is the port).
func (c *Config) checkHostServices() error {
	if len(c.HostServices) > MaxHostServices {
		return fault.New(fault.InvalidArgument, fmt.Sprintf("offer at most %d host services", MaxHostServices),
			"%d host services configured", len(c.HostServices))
	}
	for i, s := range c.HostServices {
		if s.URL == nil || !serviceName.MatchString(s.Name) || (i > 0 && c.HostServices[i-1].Name >= s.Name) {
			return fault.New(fault.InvalidArgument, "list host services once each, sorted by name, each with a URL",
				"host service %d (%q) is out of order, repeated or has no URL", i, s.Name)
		}
	}
	return nil
}

// CarriesServices says whether key's sandbox can be offered host services by this Manager: it needs the
// channel directory (Docker under runc), and why not when it cannot.
func (m *Manager) CarriesServices(key identity.Key) (bool, string) {
	switch {
	case m.cfg.Runtime == RuntimeGVisor:
		return false, "a sandbox under gVisor (runsc) cannot reach a host Unix socket"
	case m.channelDir(key) == "":
		return false, "the " + m.drv.Name() + " driver has no channel directory to carry them"
	}
	return true, ""
}

// keyServices is one key's host services, served by this process while the key's sandbox is known to it.
type keyServices struct {
	sandbox string
	lns     []net.Listener
	srvs    []*http.Server
	served  sync.WaitGroup

	mu       sync.Mutex
	open     map[string]map[string]int // service -> token -> commands that have it open now
	requests map[string]*atomic.Int64  // service -> requests let through since it was opened
	refused  func(events.HostServiceRefused)
}

// servicesFor opens req's host services for the command about to run in key's sandbox and returns their
// variables and the release that closes them (the caller holds key's gate and calls release when the command is
// over). Each opening and closing is an event of the command's run.
func (m *Manager) servicesFor(ctx context.Context, key identity.Key, grants []ServiceGrant) (env []string, release func(), err error) {
	release = func() {}
	if len(grants) == 0 {
		return nil, release, nil
	}
	if ok, why := m.CarriesServices(key); !ok {
		return nil, release, fault.New(fault.SpecUnsupported, "use the docker driver under runc for host services",
			"host services cannot be carried: %s", why)
	}
	ks, err := m.servicesOf(key)
	if err != nil {
		return nil, release, err
	}
	lim := rate.NewLimiter(1, 20)
	ks.mu.Lock()
	ks.refused = func(ev events.HostServiceRefused) {
		if lim.Allow() {
			m.emit(ctx, events.NameHostServiceRefused, ev)
		}
	}
	for _, g := range grants {
		i := m.cfg.serviceIndex(g.Name)
		if i < 0 || g.Token == "" {
			ks.mu.Unlock()
			return nil, release, fault.New(fault.InvalidArgument, "offer the service in the operator's host_services",
				"host service %q is not configured", g.Name)
		}
		if ks.open[g.Name] == nil {
			ks.open[g.Name] = map[string]int{}
			ks.requests[g.Name] = &atomic.Int64{}
		}
		ks.open[g.Name][g.Token]++
		addr := "http://" + ServiceAddress(i)
		env = append(env, ServiceEnvName(g.Name)+"URL="+addr, ServiceEnvName(g.Name)+"TOKEN="+g.Token)
		m.emit(ctx, events.NameHostServiceOpened, events.HostServiceOpened{Sandbox: ks.sandbox, Service: g.Name, Address: addr})
	}
	ks.mu.Unlock()
	release = func() {
		ks.mu.Lock()
		defer ks.mu.Unlock()
		for _, g := range grants {
			if ks.open[g.Name][g.Token]--; ks.open[g.Name][g.Token] <= 0 {
				delete(ks.open[g.Name], g.Token)
			}
			m.emit(ctx, events.NameHostServiceClosed, events.HostServiceClosed{Sandbox: ks.sandbox, Service: g.Name,
				Requests: ks.requests[g.Name].Swap(0)})
		}
		ks.refused = func(ev events.HostServiceRefused) {
			if lim.Allow() {
				m.emit(context.Background(), events.NameHostServiceRefused, ev)
			}
		}
	}
	return env, release, nil
}

// servicesOf returns key's host service server, listening on every configured service's socket in the key's
// channel directory when this process has none yet. The caller holds key's gate.
func (m *Manager) servicesOf(key identity.Key) (*keyServices, error) {
	if v, ok := m.services.Load(key.Hex()); ok {
		return v.(*keyServices), nil
	}
	dir := m.channelDir(key)
	ks := &keyServices{sandbox: key.ContainerName(), open: map[string]map[string]int{}, requests: map[string]*atomic.Int64{},
		refused: func(events.HostServiceRefused) {}}
	verify := m.verifier(func() identity.Key { return key })
	for i, svc := range m.cfg.HostServices {
		ln, err := channel.ListenSide(dir, serviceSocket(ServicePortBase+i), verify, m.cfg.Logger)
		if err != nil {
			ks.close()
			if errors.Is(err, channel.ErrInUse) {
				return nil, fault.New(fault.EgressUnavailable,
					"run the command through the sandkeep process that serves this user (e.g. the server), or stop it",
					"another sandkeep process serves the host services of sandbox %s", key.ContainerName())
			}
			return nil, fault.Wrap(err, fault.EgressUnavailable, "check that the state home is writable", "cannot serve host service %s", svc.Name)
		}
		srv := &http.Server{Handler: ks.handler(svc), ReadHeaderTimeout: 30 * time.Second, ErrorLog: nil}
		ks.lns = append(ks.lns, ln)
		ks.srvs = append(ks.srvs, srv)
		ks.served.Go(func() { _ = srv.Serve(ln) })
	}
	if v, loaded := m.services.LoadOrStore(key.Hex(), ks); loaded { // the gate makes this rare: keep the first
		ks.close()
		return v.(*keyServices), nil
	}
	return ks, nil
}

// serviceSocket is the socket of the service at port in the channel directory (the agent names the same).
func serviceSocket(port int) string { return "svc-" + strconv.Itoa(port) + ".sock" }

// handler checks the bearer token and proxies to svc's URL.
func (ks *keyServices) handler(svc HostService) http.Handler {
	target := svc.URL
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Header.Del("Authorization") // the run's token is sandkeep's, never the service's
		},
		FlushInterval: -1, // event streams (MCP's SSE) go through as they are written
		Transport:     &http.Transport{ResponseHeaderTimeout: serviceHeaderTimeout, DisableCompression: true},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "sandkeep: host service "+svc.Name+" did not answer", http.StatusBadGateway)
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reason := ks.admit(svc.Name, r.Header.Get("Authorization"))
		if reason != "" {
			ks.mu.Lock()
			refused := ks.refused
			ks.mu.Unlock()
			refused(events.HostServiceRefused{Sandbox: ks.sandbox, Service: svc.Name, Reason: reason})
			w.Header().Set("WWW-Authenticate", `Bearer realm="sandkeep"`)
			http.Error(w, "sandkeep: host service "+svc.Name+" needs the run's token: Authorization: Bearer $"+
				ServiceEnvName(svc.Name)+"TOKEN", http.StatusUnauthorized)
			return
		}
		proxy.ServeHTTP(w, r)
	})
}

// admit returns "" when auth carries the token of a run that has name open now, else why not.
func (ks *keyServices) admit(name, auth string) string {
	tok, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || tok == "" {
		return "token-missing"
	}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	match := 0
	for t := range ks.open[name] { // every open token is compared, in constant time each
		match |= subtle.ConstantTimeCompare([]byte(t), []byte(tok))
	}
	if match != 1 {
		return "token-invalid"
	}
	ks.requests[name].Add(1)
	return ""
}

func (ks *keyServices) close() {
	for _, srv := range ks.srvs {
		_ = srv.Close()
	}
	for _, ln := range ks.lns {
		_ = ln.Close()
	}
	ks.served.Wait()
}

// dropServices stops key's host services (the sandbox is stopped or gone).
func (m *Manager) dropServices(key identity.Key) {
	if v, ok := m.services.LoadAndDelete(key.Hex()); ok {
		v.(*keyServices).close()
	}
}

// closeServices stops every key's host services.
func (m *Manager) closeServices() {
	m.services.Range(func(k, v any) bool {
		m.services.Delete(k)
		v.(*keyServices).close()
		return true
	})
}
