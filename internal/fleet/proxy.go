package fleet

import (
	"context"
	"crypto/subtle"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// A public API request that holds a stream to one key's sandbox or its files (a TTY, port forwarding,
// processes, files: api.Config.Forward) goes to the key's owner whole: the replica that took it proxies it,
// upgrades and streams included, to the owner's internal address, where the owner's own API serves it, token
// checked again against the shared store. Commands without a terminal keep the wire's exec call (wire.go),
// which retries a handover without the caller noticing.

// SecretHeader carries the fleet secret on a request handed over to the owner's internal address; the
// caller's own Authorization header travels unchanged.
const SecretHeader = "Sandkeep-Fleet-Secret"

// ownerSide marks a request that arrived handed over: the owner serves it, never hands it on.
type ownerSide struct{}

// Proxy hands public API requests about keys another replica owns over to it (api.Config.Forward).
type Proxy struct {
	r      *Replica
	secret string
	rt     http.RoundTripper
}

// NewProxy returns the Proxy of replica r, authenticating to other replicas with secret.
func NewProxy(r *Replica, secret string) *Proxy {
	return &Proxy{r: r, secret: secret, rt: replicaTransport()}
}

// Forward implements api.Config.Forward: false when this replica serves key (it holds the lease, takes it, or
// the request was handed over to it), else the request is served by the owner through this one. An owner that
// cannot be reached is OWNER_UNAVAILABLE, answered before anything was written.
func (p *Proxy) Forward(w http.ResponseWriter, r *http.Request, key sandkeep.Key) (bool, error) {
	o, err := p.r.Claim(r.Context(), key)
	if err != nil {
		return false, claimErr(err) // a draining replica that no longer holds the key: SHUTTING_DOWN, nothing run
	}
	if o.Self {
		return false, nil
	}
	if r.Context().Value(ownerSide{}) != nil {
		// Handed over to a replica that no longer owns the key (it released it, or lost it): never handed on.
		return false, fault.New(fault.OwnerUnavailable, "retry: the request goes to the key's new owner",
			"the key moved to replica %s while the request was handed over", o.Lease.Owner)
	}
	to := leaseAddr{Owner: o.Lease.Owner, Address: o.Lease.Address}
	if err := p.proxy(w, r, to); err != nil {
		p.r.Forget(key)
		return false, err
	}
	return true, nil
}

// ForwardHeld hands r over to the replica that holds lease name live (Replica.Hold), when that is another; false
// when this replica serves it (it holds it, nobody does, or the request was handed over to it).
func (p *Proxy) ForwardHeld(w http.ResponseWriter, r *http.Request, name string) (bool, error) {
	if r.Context().Value(ownerSide{}) != nil {
		return false, nil
	}
	l, err := p.r.cfg.Leases.GetLease(r.Context(), name)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, claimErr(err)
	}
	if !l.Live || l.Owner == p.r.ID() || l.Address == "" {
		return false, nil
	}
	if err := p.proxy(w, r, leaseAddr{Owner: l.Owner, Address: l.Address}); err != nil {
		return false, err
	}
	return true, nil
}

// proxy serves r through the replica at to; an error means it was not reached, and nothing was written.
func (p *Proxy) proxy(w http.ResponseWriter, r *http.Request, to leaseAddr) error {
	var failed error
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "http", Host: to.Address})
			pr.Out.Host = pr.In.Host // a WebSocket's origin check compares with the Host the client sent
			pr.Out.Header.Set(SecretHeader, p.secret)
		},
		Transport:     p.rt,
		FlushInterval: -1, // output, process streams and port bytes as they come
		// Called before anything is written to w: the owner was not reached or did not answer.
		ErrorHandler: func(_ http.ResponseWriter, _ *http.Request, err error) { failed = err },
	}
	rp.ServeHTTP(w, r)
	if failed == nil {
		return nil
	}
	if err := r.Context().Err(); err != nil {
		return err
	}
	return unavailable(to, failed)
}

// Internal is the handler of a replica's internal address: the wire's calls (/fleet/v1/) and the public API
// requests other replicas hand over whole (SecretHeader). The API is set once it is built (SetAPI); a request
// handed over before that is refused (503).
type Internal struct {
	wire   *Handler
	secret []byte
	api    atomic.Pointer[http.Handler]
}

// NewInternal returns the internal handler over wire, checking handed-over requests against secret.
func NewInternal(wire *Handler, secret string) *Internal {
	return &Internal{wire: wire, secret: []byte(secret)}
}

// SetAPI sets the public API handler that serves handed-over requests.
func (in *Internal) SetAPI(h http.Handler) { in.api.Store(&h) }

func (in *Internal) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/fleet/v1/") {
		in.wire.ServeHTTP(w, r)
		return
	}
	got := []byte(r.Header.Get(SecretHeader))
	if len(got) == 0 || subtle.ConstantTimeCompare(got, in.secret) != 1 {
		http.Error(w, "unauthenticated", http.StatusUnauthorized)
		return
	}
	h := in.api.Load()
	if h == nil {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
		return
	}
	r.Header.Del(SecretHeader)
	(*h).ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ownerSide{}, true)))
}

// errNotOwner is the answer of a capability the wire does not carry for a key another replica owns (MCP's and
// E2B's files, processes and port forwards; the HTTP API hands those requests over whole).
func errNotOwner(code fault.Code, what string, to *leaseAddr) error {
	return fault.New(code, "send the request through the HTTP API, which hands it to the key's owner",
		"%s of this key are served by replica %s; through this entry point only by the owner", what, to.Owner)
}
