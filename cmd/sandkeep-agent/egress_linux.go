package main

import (
	"errors"
	"io"
	"log"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The egress forwarder. A sandbox has no network (Docker's network mode none: only its own loopback), so the
// only way out is the host's egress proxy, which listens on a Unix socket in the channel directory, bound
// read-only into the sandbox. Most clients (curl, pip, npm, git, Go) speak to an HTTP proxy at a TCP address,
// so init listens on the sandbox's loopback and splices each connection onto a fresh connection to that socket.
// It adds nothing and reads nothing: the host proxy authenticates (the token in HTTP_PROXY) and decides. Init
// dials the socket itself, so the host's SO_PEERCRED check sees PID 1, and a command that dials the socket
// directly is turned away.
//
// Init does not copy the bytes itself when it can help it: it passes the accepted socket to the host over its
// connection to e.sock (SCM_RIGHTS, one descriptor after a handoffMarker byte), and the host serves the command's
// socket directly, one socket hop fewer for every byte (internal/channel/handoff.go). Where the host answers
// that it could not use it (a runtime such as gVisor that does not pass descriptors to the host), or sending it
// fails, init copies both ways as before and stops trying to hand sockets off.
const (
	// egressSocketName is the host proxy's socket in the channel directory (lifecycle names the same).
	egressSocketName = "e.sock"
	// maxEgressConns bounds the connections forwarded at once, so a command cannot make init spend unbounded
	// memory; past it new connections are closed at once.
	maxEgressConns = 256
	// egressDialTimeout bounds connecting to the host's socket; a host that is not listening fails at once.
	egressDialTimeout = 5 * time.Second
	// spliceBuffer is each direction's copy buffer.
	spliceBuffer = 32 << 10
	// The handoff's first byte and the host's answer (internal/channel/handoff.go names the same values).
	handoffMarker = 0x00
	streamMarker  = 0x01
	handoffTaken  = 'k'
	handoffStream = 's'
	// handoffTimeout bounds waiting for the host's answer to a handoff.
	handoffTimeout = 5 * time.Second
)

// noHandoff is set once a handoff has failed: this sandbox's runtime or host does not take sockets, so every
// later connection is copied.
var noHandoff atomic.Bool

// startEgress listens on addr (the sandbox's loopback) and forwards to e.sock next to the channel socket. A
// failure to listen is logged and not fatal: commands then simply have no way out.
func startEgress(addr, channel string, logger *log.Logger) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		logger.Printf("egress forwarder: %v (commands in this sandbox have no network)", err)
		return
	}
	sock := filepath.Join(filepath.Dir(channel), egressSocketName)
	go forwardEgress(ln, func() (net.Conn, error) { return net.DialTimeout("unix", sock, egressDialTimeout) })
}

// startNetEgress is startEgress for a pod (the kubernetes driver): each connection goes to the server's channel
// address over TCP, opened with the pod's egress hello (the same name and token as the channel's), and the
// server hands what follows to the pod's egress proxy. The pod's NetworkPolicy allows that address only.
func startNetEgress(addr string, server func() string, hello []byte, logger *log.Logger) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		logger.Printf("egress forwarder: %v (commands in this sandbox have no network)", err)
		return
	}
	go forwardEgress(ln, func() (net.Conn, error) { return dialEgressNet(server(), hello) })
}

// dialEgressNet connects to the server and writes the egress hello.
func dialEgressNet(server string, hello []byte) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", server, egressDialTimeout)
	if err != nil {
		return nil, err
	}
	_ = c.SetWriteDeadline(time.Now().Add(egressDialTimeout))
	if _, err := c.Write(hello); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetWriteDeadline(time.Time{})
	return c, nil
}

// forwardEgress accepts until the listener fails; init never closes it, so it lives as long as PID 1. dial
// connects to the host's proxy.
func forwardEgress(ln net.Listener, dial func() (net.Conn, error)) {
	slots := make(chan struct{}, maxEgressConns)
	bufs := sync.Pool{New: func() any { b := make([]byte, spliceBuffer); return &b }}
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: do not spin
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			c.Close()
			continue
		}
		go func() {
			defer func() { <-slots }()
			splice(c, dial, &bufs)
		}()
	}
}

// splice hands c to the host proxy, or copies both ways between c and a new connection to the host proxy, passing
// each side's end of stream on to the other, and closes both once both directions are done. Only the Docker path
// (a Unix connection to e.sock) speaks the handoff; a pod's TCP connection to the server carries the bytes after
// its hello as they are.
func splice(c net.Conn, dial func() (net.Conn, error), bufs *sync.Pool) {
	defer c.Close()
	u, err := dial()
	if err != nil {
		return // no proxy for this sandbox (network mode none, or its host process is gone)
	}
	defer u.Close()
	uc, unix := u.(*net.UnixConn)
	if !unix {
		copyBoth(c, u, bufs)
		return
	}
	if !noHandoff.Load() {
		switch answer, sent := handOff(c, uc); {
		case answer == handoffTaken:
			return // the host serves c now; closing init's copy leaves the host's open
		case answer == handoffStream:
			noHandoff.Store(true) // the host is reading the stream already, on u
		case sent:
			return // no answer: the host may hold c, so init must not read it too; the command sees it end
		default:
			noHandoff.Store(true)
			u.Close()
			if u, err = dial(); err != nil {
				return
			}
			defer u.Close()
			if _, err := u.Write([]byte{streamMarker}); err != nil {
				return
			}
		}
	} else if _, err := u.Write([]byte{streamMarker}); err != nil {
		return
	}
	copyBoth(c, u, bufs)
}

// copyBoth copies c to u and u to c at once and returns when both directions are done.
func copyBoth(c, u net.Conn, bufs *sync.Pool) {
	done := make(chan struct{})
	go func() {
		copyHalf(u, c, bufs)
		close(done)
	}()
	copyHalf(c, u, bufs)
	<-done
}

// handOff sends c's socket to the host over u and returns the host's answer: handoffTaken (the host serves c),
// handoffStream (it did not get a usable socket and reads the bytes from u instead), or 0 when the handoff
// could not be sent (sent false: nothing reached u) or was not answered (u is then of no further use).
func handOff(c net.Conn, u *net.UnixConn) (answer byte, sent bool) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return 0, false
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var werr error
	if err := raw.Control(func(fd uintptr) {
		_, _, werr = u.WriteMsgUnix([]byte{handoffMarker}, syscall.UnixRights(int(fd)), nil)
	}); err != nil || werr != nil {
		return 0, false
	}
	_ = u.SetReadDeadline(time.Now().Add(handoffTimeout))
	var b [1]byte
	if _, err := io.ReadFull(u, b[:]); err != nil {
		return 0, true
	}
	_ = u.SetReadDeadline(time.Time{})
	switch b[0] {
	case handoffTaken, handoffStream:
		return b[0], true
	}
	return 0, true
}

type closeWriter interface{ CloseWrite() error }

// copyHalf copies src to dst, then half-closes dst so the peer sees the end of stream; on a write error it
// closes src's reading side too, so the other direction ends.
func copyHalf(dst, src net.Conn, bufs *sync.Pool) {
	b := bufs.Get().(*[]byte)
	_, err := io.CopyBuffer(dst, src, *b)
	bufs.Put(b)
	if cw, ok := dst.(closeWriter); ok && err == nil {
		_ = cw.CloseWrite()
		return
	}
	dst.Close()
	src.Close()
}

// checkEgressAddr checks --egress: a loopback host:port.
func checkEgressAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return errors.New("--egress must be a loopback address, e.g. 127.0.0.1:3128")
	}
	return nil
}
