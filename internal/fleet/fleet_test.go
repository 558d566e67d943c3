package fleet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/sqlite"
)

func openStore(t *testing.T) store.Store {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "runs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newReplica(t *testing.T, st store.LeaseStore, id string, ttl time.Duration) *Replica {
	t.Helper()
	r, err := New(Config{Leases: st, ID: id, Address: id + ":1", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustKey(t *testing.T, user string) identity.Key {
	t.Helper()
	k, err := identity.New("acme", user)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestClaim: the first replica to claim a key owns it; the other is told who does and where; renewal keeps it
// past its first expiry; a replica that stops renewing loses it to the other, whose claim then succeeds.
func TestClaim(t *testing.T) {
	st := openStore(t)
	const ttl = 600 * time.Millisecond
	a, b := newReplica(t, st, "a", ttl), newReplica(t, st, "b", ttl)
	key := mustKey(t, "alice")
	ctx := t.Context()

	oa, err := a.Claim(ctx, key)
	if err != nil || !oa.Self {
		t.Fatalf("a's claim: %+v, %v", oa, err)
	}
	ob, err := b.Claim(ctx, key)
	if err != nil || ob.Self || ob.Lease.Owner != "a" || ob.Lease.Address != "a:1" {
		t.Fatalf("b's claim of a's key: %+v, %v; want a, at a:1", ob, err)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(runCtx) }()
	time.Sleep(2 * ttl) // a renews every ttl/3
	if ob, err := b.Claim(ctx, key); err != nil || ob.Self {
		t.Fatalf("b took the key while a renewed it: %+v, %v", ob, err)
	}
	stop()
	<-done

	time.Sleep(ttl + 100*time.Millisecond) // a stopped renewing: the lease expires
	ob, err = b.Claim(ctx, key)
	if err != nil || !ob.Self || ob.Lease.Token <= oa.Lease.Token {
		t.Fatalf("b's claim after a's lease expired: %+v, %v; want it, with a token above %d", ob, err, oa.Lease.Token)
	}
	if _, ok := a.Fence(key); ok {
		t.Errorf("a still has a fence for a key whose lease expired")
	}
	if err := a.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if len(a.Held()) != 0 {
		t.Errorf("a still holds %+v after its renewal was refused", a.Held())
	}
	oa, err = a.Claim(ctx, key)
	if err != nil || oa.Self || oa.Lease.Owner != "b" {
		t.Errorf("a's claim after the takeover: %+v, %v; want b", oa, err)
	}
}

// TestReleaseAndDrain: a draining replica takes no new key but keeps its own; Release hands them over at once.
func TestReleaseAndDrain(t *testing.T) {
	st := openStore(t)
	a, b := newReplica(t, st, "a", time.Minute), newReplica(t, st, "b", time.Minute)
	ctx := t.Context()
	mine, other := mustKey(t, "alice"), mustKey(t, "bob")
	if o, err := a.Claim(ctx, mine); err != nil || !o.Self {
		t.Fatal(o, err)
	}
	a.Drain()
	if o, err := a.Claim(ctx, mine); err != nil || !o.Self {
		t.Errorf("a draining replica gave up its own key: %+v, %v", o, err)
	}
	if _, err := a.Claim(ctx, other); !fault.Is(err, fault.ShuttingDown) {
		t.Errorf("a draining replica's claim of a new key: %v, want SHUTTING_DOWN", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if o, err := b.Claim(ctx, mine); err != nil || !o.Self {
		t.Errorf("b's claim right after a released: %+v, %v; want it at once", o, err)
	}
}

// TestFencedStore: a replica records runs only of keys it holds, and once another replica took the key over,
// the old owner's writes of a run it created are refused; the new owner's go through.
func TestFencedStore(t *testing.T) {
	st := openStore(t)
	const ttl = 300 * time.Millisecond
	a, b := newReplica(t, st, "a", ttl), newReplica(t, st, "b", time.Minute)
	fa, fb := NewFencedStore(st, a), NewFencedStore(st, b)
	ctx := t.Context()
	key := mustKey(t, "alice")
	run := func() store.Run {
		id, err := store.NewRunID()
		if err != nil {
			t.Fatal(err)
		}
		return store.Run{ID: id, Tenant: "acme", User: "alice", Trust: store.TrustTrusted, Admission: store.AdmissionAdmitted}
	}
	if err := fa.CreateRun(ctx, run()); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("a run of a key the replica does not hold: %v, want ErrLeaseLost", err)
	}
	if _, err := a.Claim(ctx, key); err != nil {
		t.Fatal(err)
	}
	r := run()
	if err := fa.CreateRun(ctx, r); err != nil {
		t.Fatalf("the owner's run: %v", err)
	}
	if _, err := fa.AppendEvent(ctx, store.Event{RunID: r.ID, Name: "exec_started"}); err != nil {
		t.Fatalf("the owner's event: %v", err)
	}
	time.Sleep(ttl + 100*time.Millisecond)
	if o, err := b.Claim(ctx, key); err != nil || !o.Self {
		t.Fatalf("takeover: %+v, %v", o, err)
	}
	// a does not know yet: its fence is the old token, and the store refuses it.
	errc := make(chan error, 1)
	fa.EnqueueEvent(store.Event{RunID: r.ID, Name: "exec_finished"}, func(_ int64, err error) { errc <- err })
	if err := <-errc; !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("the stale owner's enqueued event: %v, want ErrLeaseLost", err)
	}
	if err := fa.UpdateRun(ctx, r.ID, store.RunUpdate{Status: store.StatusSucceeded}); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("the stale owner's finish: %v, want ErrLeaseLost", err)
	}
	if err := fb.UpdateRun(ctx, r.ID, store.RunUpdate{Status: store.StatusFailed, FailureCode: string(fault.OwnerLost), Disposition: store.DispositionInfrastructure}); err != nil {
		t.Errorf("the new owner finishing the run: %v", err)
	}
	evs, err := st.ListEvents(ctx, store.EventFilter{RunID: r.ID})
	if err != nil || len(evs) != 1 || evs[0].Name != "exec_started" {
		t.Errorf("events %+v, %v; want only the owner's exec_started", evs, err)
	}
}

// TestHandlerAuth: the internal wire refuses a call without the fleet's secret, or with another.
func TestHandlerAuth(t *testing.T) {
	srv := httptest.NewServer(NewHandler(&Backend{}, "0123456789abcdef-secret"))
	defer srv.Close()
	for _, auth := range []string{"", "Bearer wrong-secret-of-some-length", "0123456789abcdef-secret", "Bearer 0123456789abcdef-secre"} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/fleet/v1/exec", strings.NewReader(`{}`))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("Authorization %q: %s, want 401", auth, resp.Status)
		}
	}
	// Through a Forwarder with the wrong secret: a typed error, not a result.
	l := leaseAddr{Owner: "x", Address: strings.TrimPrefix(srv.URL, "http://")}
	err := NewForwarder(nil, "another-secret-0123456789").do(t.Context(), l, "stop", call{Tenant: "acme", User: "alice"}, nil, nil)
	if fault.CodeOf(err) == "" {
		t.Errorf("a refused forward: %v, want a typed error", err)
	}
}

// TestForwardUnreachable: an owner that cannot be reached is OWNER_UNAVAILABLE; one that hangs up during the call
// is OWNER_LOST.
func TestForwardUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	f := NewForwarder(nil, "0123456789abcdef-secret")
	err = f.do(t.Context(), leaseAddr{Owner: "gone", Address: addr}, "exec", call{}, nil, nil)
	if !fault.Is(err, fault.OwnerUnavailable) || !errors.Is(err, errNotReached) {
		t.Errorf("forward to nothing: %v, want OWNER_UNAVAILABLE, not reached (a retry may go elsewhere)", err)
	}

	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"started":true}` + "\n"))
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // the owner dies mid-command
	}))
	defer cut.Close()
	started := false
	err = f.do(t.Context(), leaseAddr{Owner: "dying", Address: strings.TrimPrefix(cut.URL, "http://")}, "exec", call{},
		func(fr frame) error { started = started || fr.Started; return nil }, nil)
	if !fault.Is(err, fault.OwnerLost) || !started || errors.Is(err, errNotReached) {
		t.Errorf("forward cut mid-call: %v (started %v), want OWNER_LOST after the start", err, started)
	}
}

// TestForwardClosedIdle: an owner shutting its internal address down closes a kept-alive connection just as the
// next call is written on it (what a rolling restart hit: OWNER_UNAVAILABLE, not retried). It never answered, so
// the call was not run there: not reached, and the caller claims the key again. An owner that answered and then
// went away may have run it: OWNER_LOST, never retried.
func TestForwardClosedIdle(t *testing.T) {
	for _, answers := range []bool{false, true} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				go owner(conn, answers)
			}
		}()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		f := NewForwarder(nil, "0123456789abcdef-secret")
		l := leaseAddr{Owner: "draining", Address: ln.Addr().String()}
		if err := f.do(ctx, l, "stop", call{}, nil, nil); err != nil {
			t.Fatalf("first call: %v", err)
		}
		err = f.do(ctx, l, "exec", call{}, nil, nil)
		ln.Close()
		switch {
		case !answers && (!fault.Is(err, fault.OwnerUnavailable) || !errors.Is(err, errNotReached)):
			t.Errorf("kept-alive connection closed before an answer: %v, want OWNER_UNAVAILABLE, not reached (the call goes to the next owner)", err)
		case answers && (!fault.Is(err, fault.OwnerLost) || errors.Is(err, errNotReached)):
			t.Errorf("connection closed after the owner answered: %v, want OWNER_LOST, never retried", err)
		}
	}
}

// owner is TestForwardClosedIdle's owner on one connection: it answers the first call, and closes the connection
// on the second (after the status line when answers), as a shutdown that takes the connection for idle does.
func owner(conn net.Conn, answers bool) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	for n := 1; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		if n == 2 {
			if answers {
				_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n")
			}
			return
		}
		_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nContent-Length: 15\r\n\r\n{\"final\":true}\n")
	}
}

// TestRouteWaitsForReaper: a key held by what takes no forwarded calls (the reaper, while it removes the key's
// orphaned sandbox: a lease without an address) is not forwarded anywhere; the replica claims it again until the
// holder releases it, then serves it itself.
func TestRouteWaitsForReaper(t *testing.T) {
	st := openStore(t)
	r := newReplica(t, st, "a", time.Second)
	b := &Backend{r: r}
	key := mustKey(t, "orphan")
	l, err := st.AcquireLease(t.Context(), LeaseName(key), "a/reaper", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	const hold = 300 * time.Millisecond
	released := make(chan error, 1)
	go func() {
		time.Sleep(hold)
		released <- st.ReleaseLease(context.Background(), l)
	}()
	start := time.Now()
	to, err := b.route(t.Context(), key)
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if err != nil || to != nil {
		t.Fatalf("route = %+v, %v; want this replica, once the reaper released the key", to, err)
	}
	if waited := time.Since(start); waited < hold {
		t.Errorf("route returned after %s, before the reaper released the key (%s)", waited, hold)
	}
}

// TestSnapshotsNeedSharedArchives: a replica whose snapshot archives are its home's alone (no snapshot_store
// bucket, no fleet.sandbox_dir) refuses every snapshot call with SPEC_UNSUPPORTED and the fix, rather than keep
// a snapshot the others cannot restore.
func TestSnapshotsNeedSharedArchives(t *testing.T) {
	b := &Backend{}
	key, _ := sandkeep.NewKey("t", "u")
	_, err := b.CreateSnapshot(t.Context(), key, "s", "")
	if fault.CodeOf(err) != fault.SpecUnsupported || !strings.Contains(err.Error(), "snapshot_store") {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	if _, err := b.Snapshots(t.Context(), "t"); fault.CodeOf(err) != fault.SpecUnsupported {
		t.Fatalf("Snapshots: %v", err)
	}
}

// TestForwardConnectBounded: an owner whose address takes no connection at all (a replica pod being torn down
// drops the packets; here a listener whose accept queue is full, which drops SYNs) is never reached: the call
// ends OWNER_UNAVAILABLE, not reached, well inside its context, so the forward goes on to the key's next owner
// instead of hanging past its whole retry budget.
func TestForwardConnectBounded(t *testing.T) {
	addr := blackHole(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*connectTimeout)
	defer cancel()
	err := NewForwarder(nil, "0123456789abcdef-secret").do(ctx, leaseAddr{Owner: "gone", Address: addr}, "exec", call{}, nil, nil)
	if !fault.Is(err, fault.OwnerUnavailable) || !errors.Is(err, errNotReached) {
		t.Fatalf("connect that never completes: %v, want OWNER_UNAVAILABLE, not reached, before the caller's deadline", err)
	}
}

// blackHole returns a loopback address whose connects hang: a listener with a backlog of 0 that never accepts,
// its queue filled first.
func blackHole(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for range 16 {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			return addr // this connect hung: the queue is full
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Fatal("the listener's queue never filled")
	return ""
}
