package fleet

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
)

// The internal wire between replicas: HTTP on the replica's internal address, every request authenticated by
// the fleet's shared secret (a bearer token compared in constant time). A call is a POST of one JSON object to
// /fleet/v1/<op>; the answer is NDJSON frames: for exec, "started" and output chunks as the command produces
// them, then one final frame with the result or the typed error. A call whose stream ends without a final frame
// was cut: the owner went away (OWNER_LOST).

// MinSecretBytes is the shortest fleet secret accepted.
const MinSecretBytes = 16

// maxCallBytes bounds a call's JSON body (an exec's stdin included).
const maxCallBytes = 64 << 20

// call is the body of every internal request; each op reads the fields it needs.
type call struct {
	Tenant string    `json:"tenant"`
	User   string    `json:"user"`
	Admit  admitCall `json:"admit"`
	Exec   *execCall `json:"exec,omitempty"`
	RunID  string    `json:"run_id,omitempty"` // endrun
	Failed bool      `json:"failed,omitempty"` // endrun
	// Snapshot names the snapshot to take or restore; Replace restores onto a key that exists.
	Snapshot string `json:"snapshot,omitempty"`
	Replace  bool   `json:"replace,omitempty"`
	ForkTo   string `json:"fork_to,omitempty"` // fork: the new key's user, of the source's tenant
}

type admitCall struct {
	RunID     string            `json:"run_id,omitempty"`
	Template  string            `json:"template,omitempty"`
	Trust     string            `json:"trust,omitempty"`
	RequestID string            `json:"request_id,omitempty"`
	Network   *sandkeep.Network `json:"network,omitempty"`
}

type execCall struct {
	Argv        []string      `json:"argv"`
	Workdir     string        `json:"workdir,omitempty"`
	Env         []string      `json:"env,omitempty"`
	Timeout     time.Duration `json:"timeout,omitempty"`
	OutputLimit int64         `json:"output_limit,omitempty"`
	Stdin       *[]byte       `json:"stdin,omitempty"`
	Stream      bool          `json:"stream,omitempty"` // the caller wants output as it comes
	Concurrent  bool          `json:"concurrent,omitempty"`
}

// frame is one NDJSON line of an answer.
type frame struct {
	Started bool            `json:"started,omitempty"`
	Stream  string          `json:"stream,omitempty"` // stdout | stderr
	Data    []byte          `json:"data,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *wireError      `json:"error,omitempty"`
	Final   bool            `json:"final,omitempty"`
}

type wireError struct {
	Code    fault.Code `json:"code"`
	Message string     `json:"message"`
	Hint    string     `json:"hint,omitempty"`
}

func toWire(err error) *wireError {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return &wireError{Code: fe.Code, Message: fe.Message, Hint: fe.Hint}
	}
	return &wireError{Code: fault.Internal, Message: err.Error()}
}

func (w *wireError) err() error { return fault.New(w.Code, w.Hint, "%s", w.Message) }

// Handler serves the internal wire for the owner's side: every call runs on local, which claims the key again
// and refuses (OWNER_UNAVAILABLE) rather than forwarding a second time when another replica holds it now.
type Handler struct {
	local  *Backend
	secret []byte

	mu    sync.RWMutex   // held for writing by Wait: no call is counted in once it waits
	calls sync.WaitGroup // the calls in flight that were taken before the replica drained
}

// NewHandler returns the internal handler of b, authenticating callers with secret.
func NewHandler(b *Backend, secret string) *Handler {
	return &Handler{local: b, secret: []byte(secret)}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	got, ok := bytes.CutPrefix([]byte(r.Header.Get("Authorization")), []byte("Bearer "))
	if !ok || subtle.ConstantTimeCompare(got, h.secret) != 1 {
		http.Error(w, "unauthenticated", http.StatusUnauthorized)
		return
	}
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	var c call
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCallBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		http.Error(w, "bad call: "+err.Error(), http.StatusBadRequest)
		return
	}
	fw := &frameWriter{w: w}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fw.flush()
	res, err := h.serve(r.Context(), r.URL.Path, c, fw)
	final := frame{Final: true}
	if err != nil {
		final.Error = toWire(err)
	} else if res != nil {
		b, merr := json.Marshal(res)
		if merr != nil {
			final.Error = toWire(merr)
		} else {
			final.Result = b
		}
	}
	fw.send(final)
}

func (h *Handler) serve(ctx context.Context, path string, c call, fw *frameWriter) (any, error) {
	if !h.begin() {
		// Handing over: the calls in flight finish, new ones go elsewhere once the leases are released. The caller
		// knows nothing ran (errNotReached) and claims again.
		return nil, errHandingOver
	}
	defer h.calls.Done()
	key, err := sandkeep.NewKey(c.Tenant, c.User)
	if err != nil {
		return nil, err
	}
	if path == "/fleet/v1/endrun" {
		return nil, h.local.endRunHere(ctx, key, c.RunID, c.Failed)
	}
	if err := h.local.mine(ctx, key); err != nil {
		return nil, err
	}
	ar := service.AdmitRequest{RunID: c.Admit.RunID, Template: c.Admit.Template, Trust: c.Admit.Trust,
		RequestID: c.Admit.RequestID, Network: c.Admit.Network}
	switch path {
	case "/fleet/v1/exec":
		if c.Exec == nil {
			return nil, fault.New(fault.RequestInvalid, "", "an exec call without a command")
		}
		e := c.Exec
		req := sandkeep.ExecRequest{Argv: e.Argv, Workdir: e.Workdir, Env: e.Env, Timeout: e.Timeout,
			OutputLimit: e.OutputLimit, Concurrent: e.Concurrent}
		if e.Stdin != nil {
			req.Stdin = bytes.NewReader(*e.Stdin)
		}
		if e.Stream {
			req.Stdout, req.Stderr = fw.writer("stdout"), fw.writer("stderr")
		}
		ar.Observer.Started = func() { fw.send(frame{Started: true}) }
		return h.local.local.Exec(ctx, key, ar, req)
	case "/fleet/v1/admit":
		return h.local.local.Admit(ctx, key, ar)
	case "/fleet/v1/sandbox":
		return h.local.local.Sandbox(ctx, key)
	case "/fleet/v1/stop":
		return nil, h.local.local.Stop(ctx, key)
	case "/fleet/v1/remove":
		return nil, h.local.local.Remove(ctx, key)
	case "/fleet/v1/snapshot":
		return h.local.local.CreateSnapshot(ctx, key, c.Snapshot, c.Admit.RequestID)
	case "/fleet/v1/restore":
		return h.local.local.RestoreSnapshot(ctx, c.Snapshot, key, ar, service.RestoreOptions{Replace: c.Replace})
	case "/fleet/v1/fork":
		to, err := sandkeep.NewKey(c.Tenant, c.ForkTo)
		if err != nil {
			return nil, err
		}
		return h.local.forkHere(ctx, key, to, ar)
	}
	return nil, fault.New(fault.RequestInvalid, "", "no internal operation %s", path)
}

// begin counts a call in, unless the replica drains (false: the call is refused, nothing run).
func (h *Handler) begin() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.local.r.Draining() {
		return false
	}
	h.calls.Add(1)
	return true
}

// Wait waits, bounded by ctx, for the forwarded calls this replica took before it drained (Replica.Drain, which
// must come first); calls arriving since are answered SHUTTING_DOWN. The leases are handed over after it
// (Handover), so no key's next owner starts while a forwarded command still runs here.
func (h *Handler) Wait(ctx context.Context) error {
	h.mu.Lock() // a barrier: every call that passed begin's check before Drain has been counted in
	h.mu.Unlock()
	done := make(chan struct{})
	go func() { h.calls.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// frameWriter writes NDJSON frames; exec's two output streams may write at once.
type frameWriter struct {
	mu sync.Mutex
	w  http.ResponseWriter
}

func (f *frameWriter) send(fr frame) {
	b, _ := json.Marshal(fr)
	f.mu.Lock()
	defer f.mu.Unlock()
	_, _ = f.w.Write(append(b, '\n'))
	_ = http.NewResponseController(f.w).Flush()
}

func (f *frameWriter) flush() { _ = http.NewResponseController(f.w).Flush() }

func (f *frameWriter) writer(stream string) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		f.send(frame{Stream: stream, Data: bytes.Clone(p)})
		return len(p), nil
	})
}

type writerFunc func(p []byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// Forwarder makes calls to other replicas.
type Forwarder struct {
	client *http.Client
	secret string
}

// NewForwarder returns a Forwarder that authenticates with secret. hc nil: a client without a timeout (each
// call's ctx bounds it).
func NewForwarder(hc *http.Client, secret string) *Forwarder {
	if hc == nil {
		hc = &http.Client{Transport: replicaTransport()}
	}
	return &Forwarder{client: hc, secret: secret}
}

// connectTimeout bounds a connection to another replica's internal address. Without it, a connect to a
// replica pod being torn down (its packets dropped, not refused) hangs past the forward's whole retry budget
// (a lease's life and 5 s), and the caller gets OWNER_UNAVAILABLE although the key's new owner was ready: a
// connection that never completed was never reached, so it is retried like a refused one. Replicas share a
// network, so 2 s is far above a real connect.
const connectTimeout = 2 * time.Second

// replicaTransport is the transport of calls and requests to other replicas: kept-alive connections, each
// connect bounded by connectTimeout. Nothing bounds an answer: the owner may be running the command.
func replicaTransport() *http.Transport {
	d := &net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute}
}

// do posts c to op at the owner of l and reads the answer's frames: on turns each non-final frame over, the
// final one's result is decoded into out. The errors say where it broke: not reached (OWNER_UNAVAILABLE), or
// cut once the owner had the call (OWNER_LOST).
func (f *Forwarder) do(ctx context.Context, l leaseAddr, op string, c call, on func(frame) error, out any) error {
	if l.Address == "" { // a holder that takes no calls (the reaper) kept the key past Backend.route's wait
		return unavailable(l, errors.New("the holder takes no forwarded calls"))
	}
	body, err := json.Marshal(c)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+l.Address+"/fleet/v1/"+op, bytes.NewReader(body))
	if err != nil {
		return unavailable(l, err)
	}
	req.Header.Set("Authorization", "Bearer "+f.secret)
	req.Header.Set("Content-Type", "application/json")
	// The owner answers a call's status line before it does anything with it (Handler.ServeHTTP): a call that
	// failed before the answer's first byte was never run there. That is a refused connection, and as well a
	// kept-alive connection the owner closed while idle (a replica shutting its internal address down) just as
	// the call was written on it, which the transport does not retry for a POST.
	var answered atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotFirstResponseByte: func() { answered.Store(true) },
	}))
	resp, err := f.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !answered.Load() {
			err = errors.Join(errNotReached, err)
		}
		return unavailable(l, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fault.New(fault.Internal, "check that every replica has the same fleet secret",
			"replica %s refused the forwarded call: %s: %s", l.Owner, resp.Status, bytes.TrimSpace(msg))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxCallBytes*2)
	for sc.Scan() {
		var fr frame
		if err := json.Unmarshal(sc.Bytes(), &fr); err != nil {
			return fault.Wrap(err, fault.Internal, "", "replica %s sent a malformed frame", l.Owner)
		}
		if !fr.Final {
			if on != nil {
				if err := on(fr); err != nil {
					return err
				}
			}
			continue
		}
		if fr.Error != nil {
			if fr.Error.Code == fault.ShuttingDown {
				return errors.Join(errNotReached, fr.Error.err()) // the owner refused it before running anything
			}
			return fr.Error.err()
		}
		if out != nil && len(fr.Result) > 0 {
			if err := json.Unmarshal(fr.Result, out); err != nil {
				return fault.Wrap(err, fault.Internal, "", "replica %s sent a malformed result", l.Owner)
			}
		}
		// The answer's end follows the final frame: read it, so the connection is kept for the next call.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fault.Wrap(sc.Err(), fault.OwnerLost,
		"run the command again: another replica takes the key over once the lease expires",
		"replica %s, which owns this key, went away during the call; its outcome is unknown", l.Owner)
}

// errHandingOver is the owner's answer to a call that arrives while it drains: nothing was run.
var errHandingOver = fault.New(fault.ShuttingDown, "retry: the key's next owner takes it",
	"the replica that owns this key is handing its keys over")

// errNotReached is in a forward's error when the owner provably never ran the call (it refused the connection,
// closed it before answering, or answered SHUTTING_DOWN): the call may go elsewhere.
var errNotReached = errors.New("the owner was not reached")

// leaseAddr is who a forwarded call goes to.
type leaseAddr struct{ Owner, Address string }

func unavailable(l leaseAddr, err error) error {
	return fault.Wrap(err, fault.OwnerUnavailable,
		"retry after the key's lease expires: another replica then takes the key over",
		"replica %s holds this key and cannot be reached at %s", l.Owner, l.Address)
}
