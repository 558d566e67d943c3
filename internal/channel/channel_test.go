package channel

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func self(pid int) bool { return pid == os.Getpid() }

func listen(t *testing.T, dir string, v Verifier) *Listener {
	t.Helper()
	l, err := Listen(dir, v, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func dial(t *testing.T, dir string) net.Conn {
	t.Helper()
	c, err := Dial(filepath.Join(dir, SocketName), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestTakeVerifiedConnection(t *testing.T) {
	dir := t.TempDir()
	l := listen(t, dir, self)
	agent := dial(t, dir)
	c, err := l.Take(t.Context(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// The connection works both ways: a command's frame from the agent reaches the command's side.
	if err := agentproto.WriteFrame(agent, agentproto.FrameStdout, 1, []byte("x")); err != nil {
		t.Fatal(err)
	}
	var buf []byte
	if f, err := agentproto.ReadFrame(c.Commands(), &buf); err != nil || string(f.Payload) != "x" {
		t.Fatalf("read %q, %v", f.Payload, err)
	}
	fi, err := os.Stat(filepath.Join(dir, SocketName))
	if err != nil || fi.Mode().Perm() != 0o666 {
		t.Fatalf("socket mode: %v %v", fi.Mode(), err)
	}
}

func TestRefusesOtherPeers(t *testing.T) {
	dir := t.TempDir()
	l := listen(t, dir, func(int) bool { return false }) // nobody is the sandbox's PID 1
	c := dial(t, dir)
	if _, err := l.Take(t.Context(), 300*time.Millisecond); !errors.Is(err, ErrNoChannel) {
		t.Fatalf("Take = %v, want ErrNoChannel", err)
	}
	// The refused connection was closed by the host.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("refused connection still open")
	}
}

func TestDeadOrChattyConnectionIsDropped(t *testing.T) {
	for _, tc := range []struct {
		name string
		kill func(net.Conn)
	}{
		{"closed", func(c net.Conn) { c.Close() }},
		{"garbage while idle", func(c net.Conn) { c.Write([]byte("forged")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := listen(t, dir, self)
			agent := dial(t, dir)
			first, err := l.Take(t.Context(), 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			tc.kill(agent)
			time.Sleep(50 * time.Millisecond) // let the bytes or the FIN arrive
			if _, err := l.Take(t.Context(), 200*time.Millisecond); !errors.Is(err, ErrNoChannel) {
				t.Fatalf("Take after %s = %v, want ErrNoChannel", tc.name, err)
			}
			dial(t, dir) // the agent reconnects
			second, err := l.Take(t.Context(), 10*time.Second)
			if err != nil || second == first {
				t.Fatalf("Take after reconnect = %v, %v (same as before: %v)", second, err, second == first)
			}
		})
	}
}

func TestWaitReconnect(t *testing.T) {
	dir := t.TempDir()
	l := listen(t, dir, self)
	dial(t, dir)
	old, err := l.Take(t.Context(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l.Broken(old)
	if l.WaitReconnect(t.Context(), old, 100*time.Millisecond) {
		t.Fatal("reconnected without a new connection")
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		if c, err := net.Dial("unix", filepath.Join(dir, SocketName)); err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}()
	if !l.WaitReconnect(t.Context(), old, 10*time.Second) {
		t.Fatal("no reconnection seen")
	}
}

func TestSecondListenerIsRefusedStaleOneReplaced(t *testing.T) {
	dir := t.TempDir()
	l := listen(t, dir, self)
	if _, err := Listen(dir, self, nil); !errors.Is(err, ErrInUse) {
		t.Fatalf("second Listen = %v, want ErrInUse", err)
	}
	l.Close()
	if _, err := os.Stat(filepath.Join(dir, SocketName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after Close: %v", err)
	}
	// A stale socket file from a process that died is replaced.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, SocketName), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	l2 := listen(t, dir, self)
	dial(t, dir)
	if _, err := l2.Take(t.Context(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestLongDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	l := listen(t, dir, self)
	dial(t, dir)
	if _, err := l.Take(t.Context(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestTakeHonoursContext(t *testing.T) {
	l := listen(t, t.TempDir(), self)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := l.Take(ctx, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("Take = %v, want context.Canceled", err)
	}
	l.Close()
	if _, err := l.Take(t.Context(), time.Minute); !errors.Is(err, ErrNoChannel) {
		t.Fatalf("Take after Close = %v", err)
	}
}

// TestOneConnectionAtATime: while the agent's connection is up, another connection, even one that would pass
// verification, is closed without being verified and does not replace it; once the first is gone, the next one
// is taken.
func TestOneConnectionAtATime(t *testing.T) {
	dir := t.TempDir()
	var verified atomicCount
	l := listen(t, dir, func(pid int) bool { verified.add(); return self(pid) })
	agent := dial(t, dir)
	first, err := l.Take(t.Context(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	intruder := dial(t, dir)
	intruder.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := intruder.Read(make([]byte, 1)); err == nil {
		t.Fatal("a second connection was kept open")
	}
	if n := verified.get(); n != 1 {
		t.Fatalf("verifier called %d times, want 1 (the second connection must be refused before it)", n)
	}
	if c, err := l.Take(t.Context(), time.Second); err != nil || c != first {
		t.Fatalf("Take after the intruder = %v, %v; want the first connection", c, err)
	}
	// The agent's connection ends (its serve child died): the reconnection is taken.
	agent.Close()
	time.Sleep(50 * time.Millisecond)
	dial(t, dir)
	if !l.WaitReconnect(t.Context(), first, 10*time.Second) {
		t.Fatal("the reconnection after the first connection ended was not taken")
	}
}

type atomicCount struct {
	mu sync.Mutex
	n  int
}

func (a *atomicCount) add() { a.mu.Lock(); a.n++; a.mu.Unlock() }
func (a *atomicCount) get() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

// TestPeerNameHidesHome: what a sandbox reads as the channel sockets' peer name (getpeername on its
// connection) does not hold the host directory they live in, for the agent's socket and the egress one
// (issue 22, Low 12: it showed the state home's path).
func TestPeerNameHidesHome(t *testing.T) {
	dir := t.TempDir()
	listen(t, dir, self)
	side, err := ListenSide(dir, EgressSocketName, self, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer side.Close()
	for _, name := range []string{SocketName, EgressSocketName} {
		c, err := net.Dial("unix", filepath.Join(dir, name)) // as the sandbox does: by the path it sees
		if err != nil {
			t.Fatal(err)
		}
		peer := c.RemoteAddr().String()
		c.Close()
		if strings.Contains(peer, dir) || strings.Contains(peer, filepath.Base(dir)) {
			t.Errorf("%s: the peer name %q shows the host directory %s", name, peer, dir)
		}
	}
}
