package channel

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// sideFor listens on a fresh e.sock that accepts this process as the sandbox's init, and returns the listener and
// the socket's path.
func sideFor(t *testing.T) (*SideListener, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "chan")
	l, err := ListenSide(dir, EgressSocketName, func(pid int) bool { return pid == os.Getpid() }, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, filepath.Join(dir, EgressSocketName)
}

// tcpPair returns both ends of a loopback TCP connection: the "command's" end and the end init accepted.
func tcpPair(t *testing.T) (cmd, accepted *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); a.Close() })
	return c.(*net.TCPConn), a.(*net.TCPConn)
}

// sendFD writes marker with fd attached on u.
func sendFD(t *testing.T, u *net.UnixConn, marker byte, fd int) {
	t.Helper()
	if _, _, err := u.WriteMsgUnix([]byte{marker}, syscall.UnixRights(fd), nil); err != nil {
		t.Fatal(err)
	}
}

func fdOf(t *testing.T, c syscall.Conn) int {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got int
	if err := raw.Control(func(fd uintptr) { got = int(fd) }); err != nil {
		t.Fatal(err)
	}
	return got
}

func acceptOne(t *testing.T, l *SideListener) net.Conn {
	t.Helper()
	got := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	select {
	case c := <-got:
		if c == nil {
			t.FailNow()
		}
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("nothing accepted")
		return nil
	}
}

func readByte(t *testing.T, c net.Conn) byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		t.Fatal(err)
	}
	return b[0]
}

// echoes checks that bytes written on one end arrive at the other, both ways.
func echoes(t *testing.T, a, b net.Conn) {
	t.Helper()
	for _, p := range [][2]net.Conn{{a, b}, {b, a}} {
		if _, err := p[0].Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		_ = p[1].SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(p[1], buf); err != nil || string(buf) != "ping" {
			t.Fatalf("read %q, %v", buf, err)
		}
	}
}

// TestHandoff: init passes the command's TCP socket; the host answers that it took it, Accept hands out that
// socket (the TCP connection itself, not the Unix one, so the proxy's copies splice it), and bytes go both ways
// between the command and the host once init has closed its own copies.
func TestHandoff(t *testing.T) {
	l, path := sideFor(t)
	cmd, accepted := tcpPair(t)
	u, err := Dial(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	sendFD(t, u.(*net.UnixConn), HandoffMarker, fdOf(t, accepted))
	got := acceptOne(t, l)
	if b := readByte(t, u); b != HandoffTaken {
		t.Fatalf("answer %q, want %q", b, HandoffTaken)
	}
	accepted.Close() // init's copy
	hc, ok := got.(*handedConn)
	if !ok {
		t.Fatalf("Accept handed out a %T, want the sandbox's TCP socket", got)
	}
	var _ io.ReaderFrom = hc // io.Copy finds TCPConn's ReadFrom and WriteTo: splice both ways
	var _ io.WriterTo = hc
	echoes(t, cmd, got)
	got.Close()
	_ = cmd.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := cmd.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("the host closed the socket, the command read %d, %v", n, err)
	}
	select {
	case l.slots <- struct{}{}: // Close gave its slot back: the bound has room for every other one
		<-l.slots
	default:
		t.Fatal("no slot free")
	}
}

// TestHandoffNotTCP: a descriptor that is not a connected TCP socket (a pipe, a listening socket) is refused:
// the host answers "stream", closes what it received, and serves the Unix connection's bytes instead.
func TestHandoffNotTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var pipe [2]int
	if err := syscall.Pipe(pipe[:]); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(pipe[0])
	defer syscall.Close(pipe[1])
	for name, fd := range map[string]int{"pipe": pipe[0], "listening": fdOf(t, ln.(*net.TCPListener))} {
		t.Run(name, func(t *testing.T) {
			l, path := sideFor(t)
			u, err := Dial(path, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			sendFD(t, u.(*net.UnixConn), HandoffMarker, fd)
			got := acceptOne(t, l)
			if b := readByte(t, u); b != HandoffStream {
				t.Fatalf("answer %q, want %q", b, HandoffStream)
			}
			if _, ok := got.(*net.UnixConn); !ok {
				t.Fatalf("Accept handed out a %T, want the Unix connection", got)
			}
			echoes(t, u, got)
		})
	}
}

// TestHandoffStream: StreamMarker is consumed and the bytes after it are the stream; a first byte that is no
// marker (an init from before the handoff) is the command's and stays in place; a peer that sends nothing is
// still accepted, after the handoff's wait.
func TestHandoffStream(t *testing.T) {
	l, path := sideFor(t)
	for _, tc := range []struct {
		send, want string
	}{
		{"\x01CONNECT", "CONNECT"},
		{"GET http://x/", "GET http://x/"},
	} {
		u, err := Dial(path, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		if _, err := u.Write([]byte(tc.send)); err != nil {
			t.Fatal(err)
		}
		got := acceptOne(t, l)
		buf := make([]byte, len(tc.want))
		_ = got.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(got, buf); err != nil || string(buf) != tc.want {
			t.Fatalf("sent %q, the host read %q, %v", tc.send, buf, err)
		}
	}
	u, err := Dial(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	got := acceptOne(t, l)
	echoes(t, u, got)
}
