package channel

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// countingHandler counts the log records it gets.
type countingHandler struct{ n atomic.Int32 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (h *countingHandler) Handle(context.Context, slog.Record) error { h.n.Add(1); return nil }
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler        { return h }
func (h *countingHandler) WithGroup(string) slog.Handler             { return h }

// TestPeerCheckFlood: a process that is not the sandbox's init dialing the egress socket and the channel in a loop
// costs one engine call (check) and one log line per listener, not one each time; the cached init is accepted
// without any engine call.
func TestPeerCheckFlood(t *testing.T) {
	const dials = 300
	var engineCalls atomic.Int32
	var initPID atomic.Int64 // the cached PID 1: none yet
	known := func(pid int) bool { return int64(pid) == initPID.Load() }
	check := func(int) bool { engineCalls.Add(1); return false } // the engine: not our init
	logs := &countingHandler{}
	dir := filepath.Join(t.TempDir(), "chan")

	side, err := ListenSide(dir, EgressSocketName, Throttle(known, check, time.Hour), slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	defer side.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		for {
			c, err := side.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	ch, err := Listen(dir, Throttle(known, check, time.Hour), slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()

	for i := range dials {
		for _, name := range []string{EgressSocketName, SocketName} {
			c, err := Dial(filepath.Join(dir, name), time.Second)
			if err != nil {
				t.Fatalf("dial %d: %v", i, err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Read(make([]byte, 1)) // closed by the listener
			c.Close()
		}
	}
	if n := engineCalls.Load(); n != 2 {
		t.Errorf("%d dials cost %d engine calls, want one per listener", 2*dials, n)
	}
	if n := logs.n.Load(); n != 2 {
		t.Errorf("%d refusals logged %d lines, want one per listener", 2*dials, n)
	}

	// The sandbox's init, as cached: accepted with no engine call.
	initPID.Store(int64(os.Getpid()))
	c, err := Dial(filepath.Join(dir, EgressSocketName), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case got := <-accepted:
		got.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the cached init's connection was not accepted")
	}
	if n := engineCalls.Load(); n != 2 {
		t.Errorf("the cached init cost an engine call (%d in all)", n)
	}
}

// TestThrottleInterval: past the interval a new pid is checked again, and a pid once refused is refused without
// asking; a pid the check accepts is accepted.
func TestThrottleInterval(t *testing.T) {
	now := time.Unix(1000, 0)
	var calls int
	tr := &throttle{known: func(int) bool { return false }, check: func(pid int) bool { calls++; return pid == 7 },
		every: time.Second, now: func() time.Time { return now }}
	if tr.verify(5) || calls != 1 {
		t.Fatalf("first check: calls %d", calls)
	}
	if tr.verify(6) || calls != 1 {
		t.Fatalf("within the interval: calls %d, want no new call", calls)
	}
	now = now.Add(2 * time.Second)
	if tr.verify(5) || calls != 1 {
		t.Fatalf("a refused pid was asked about again: calls %d", calls)
	}
	if !tr.verify(7) || calls != 2 {
		t.Fatalf("the init after the interval: calls %d", calls)
	}
	if tr.verify(0) || tr.verify(-1) {
		t.Fatal("a pid <= 0 was accepted")
	}
}
