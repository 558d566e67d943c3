//go:build linux

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// startServeOnSocket runs `sandkeep-agent serve` on one end of a Unix socket pair, as init does with the
// channel's connection, and returns the other end. The agent must exit with wantExit[0] (default 0: a clean end).
func startServeOnSocket(t *testing.T, wantExit ...int) *net.UnixConn {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	agentEnd := os.NewFile(uintptr(fds[0]), "agent")
	hostEnd := os.NewFile(uintptr(fds[1]), "host")
	cmd := exec.Command(agentBin, "serve")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = agentEnd, agentEnd, os.Stderr // *os.File: no copy goroutines
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	agentEnd.Close()
	fc, err := net.FileConn(hostEnd)
	hostEnd.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		fc.Close()
		_ = cmd.Wait()
		want := 0
		if len(wantExit) > 0 {
			want = wantExit[0]
		}
		if code := cmd.ProcessState.ExitCode(); code != want {
			t.Errorf("agent exit %d, want %d", code, want)
		}
	})
	return fc.(*net.UnixConn)
}

// echoServer accepts on 127.0.0.1 and copies each connection's bytes back until the client half-closes, then
// half-closes itself.
func echoServer(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return netip.MustParseAddrPort(ln.Addr().String())
}

// TestForwardEcho: many streams on one channel at once, each sending a few MiB of random bytes and reading them
// back through a server on the agent's loopback, intact (SHA-256), with half-close both ways, while commands run
// on the same channel.
func TestForwardEcho(t *testing.T) {
	mux := agentproto.NewMux(startServeOnSocket(t))
	defer mux.Close()
	target := echoServer(t)

	const streams, size = 16, 3 << 20
	var wg sync.WaitGroup
	errs := make(chan error, streams+1)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- echoOnce(t.Context(), mux, target, size+i)
		}()
	}
	wg.Add(1)
	go func() { // commands on the same channel meanwhile
		defer wg.Done()
		for i := range 5 {
			var out bytes.Buffer
			req := agentproto.Request{Version: agentproto.Version, ID: uint32(i + 1), Argv: sh("echo cmd-" + fmt.Sprint(i)),
				TimeoutMS: 30_000, StdoutLimit: agentproto.DefaultLimit, StderrLimit: agentproto.DefaultLimit}
			res, err := agentproto.Run(t.Context(), mux.Commands(), req, &out, io.Discard, nil)
			if err == nil && (res.ExitCode != 0 || out.String() != fmt.Sprintf("cmd-%d\n", i)) {
				err = fmt.Errorf("command %d: exit %d, stdout %q", i, res.ExitCode, out.String())
			}
			if err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := mux.Streams(); n != 0 {
		t.Fatalf("%d streams still open after every connection closed", n)
	}
	if !mux.Idle() {
		t.Fatal("the channel is not idle after the commands")
	}
}

// echoOnce sends size random bytes through a stream to the echo server, half-closes, and checks that exactly
// those bytes come back, followed by EOF.
func echoOnce(ctx context.Context, mux *agentproto.Mux, target netip.AddrPort, size int) error {
	s, err := mux.Dial(ctx, target)
	if err != nil {
		return err
	}
	defer s.Close()
	data := make([]byte, size)
	_, _ = rand.Read(data)
	want := sha256.Sum256(data)
	werr := make(chan error, 1)
	go func() {
		_, err := s.Write(data)
		if err == nil {
			err = s.CloseWrite()
		}
		werr <- err
	}()
	h := sha256.New()
	n, err := io.Copy(h, s)
	if err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if n != int64(size) || !bytes.Equal(h.Sum(nil), want[:]) {
		return fmt.Errorf("%d bytes came back, want %d, hash equal %v", n, size, bytes.Equal(h.Sum(nil), want[:]))
	}
	return nil
}

// TestForwardSlowReader: a stream whose reader never reads holds at most its window and stops only its own
// sender; other streams and commands on the channel go on.
func TestForwardSlowReader(t *testing.T) {
	mux := agentproto.NewMux(startServeOnSocket(t))
	defer mux.Close()
	// A server that writes 64 MiB to whoever connects, as fast as it may.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	flooded := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			flooded <- -1
			return
		}
		defer c.Close()
		n, _ := io.Copy(c, io.LimitReader(zeroReader{}, 64<<20))
		flooded <- n
	}()
	slow, err := mux.Dial(t.Context(), netip.MustParseAddrPort(ln.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // let the flood fill every buffer on its way
	for i := range 3 {
		if err := echoOnce(t.Context(), mux, echoServer(t), 1<<20); err != nil {
			t.Fatalf("stream %d beside a stalled one: %v", i, err)
		}
	}
	var out bytes.Buffer
	req := agentproto.Request{Version: agentproto.Version, ID: 1, Argv: sh("echo still"), TimeoutMS: 30_000,
		StdoutLimit: agentproto.DefaultLimit, StderrLimit: agentproto.DefaultLimit}
	if _, err := agentproto.Run(t.Context(), mux.Commands(), req, &out, io.Discard, nil); err != nil || out.String() != "still\n" {
		t.Fatalf("command beside a stalled stream: %v %q", err, out.String())
	}
	select {
	case n := <-flooded:
		t.Fatalf("the flood finished (%d bytes) although nobody read it", n)
	default:
	}
	// Now read it all: it arrives intact and ends with EOF.
	n, err := io.Copy(io.Discard, slow)
	if err != nil || n != 64<<20 {
		t.Fatalf("read the flood: %d bytes, %v", n, err)
	}
	slow.Close()
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestForwardRefusals: the agent itself refuses a target that is not its loopback (the host's check is bypassed
// by writing the open frame by hand; the address is a documentation one, and the refusal comes before any
// connect), an ID in use, and a port nothing listens on is unreachable; the channel stays usable.
func TestForwardRefusals(t *testing.T) {
	conn := startServeOnSocket(t, 1) // it ends on the garbage at the end
	var buf []byte
	ask := func(id uint32, target string) (agentproto.Frame, error) {
		t.Helper()
		if err := agentproto.WriteFrame(conn, agentproto.FrameForwardOpen, id,
			agentproto.EncodeForwardOpen(netip.MustParseAddrPort(target))); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		f, err := agentproto.ReadFrame(conn, &buf)
		if err != nil {
			t.Fatal(err)
		}
		if f.Type != agentproto.FrameForwardReply || f.ID != id {
			t.Fatalf("got frame %v for %d, want a reply for %d", f.Type, f.ID, id)
		}
		return f, agentproto.DecodeForwardReply(f.Payload)
	}
	for i, target := range []string{"192.0.2.1:80", "[2001:db8::1]:80", "0.0.0.0:80", "[::]:80"} {
		if _, err := ask(uint32(10+i), target); !errors.Is(err, agentproto.ErrForwardRefused) {
			t.Fatalf("%s: %v, want refused", target, err)
		}
	}
	// A loopback port nothing listens on.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closedPort := ln.Addr().String()
	ln.Close()
	if _, err := ask(20, closedPort); !errors.Is(err, agentproto.ErrForwardUnreachable) {
		t.Fatalf("closed port: %v, want unreachable", err)
	}
	// A live one, then the same ID again while it is open.
	live := echoServer(t)
	if _, err := ask(21, live.String()); err != nil {
		t.Fatalf("live port: %v", err)
	}
	if _, err := ask(21, live.String()); !errors.Is(err, agentproto.ErrForwardRefused) {
		t.Fatalf("reused ID: %v, want refused", err)
	}
	// Garbage in a forward frame breaks the channel, as any other protocol violation does.
	if err := agentproto.WriteFrame(conn, agentproto.FrameForwardCredit, 21, []byte{0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := agentproto.ReadFrame(conn, &buf); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("after a zero credit: %v, want the agent to hang up", err)
			}
			break
		}
	}
}
