// Package benchnet holds the loopback pieces every benchmark of the egress path shares: the `sandkeep bench`
// scenarios (internal/bench) and the egress package's Go benchmarks. A resolver that answers every name with
// 127.0.0.1, a CONNECT over an open connection, and a transfer server and client that move a fixed number of
// bytes up or down in large calls. It never dials anything: the caller connects, to loopback only.
package benchnet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"
)

// Chunk is the size of one read or write of a transfer: large, so that the path, not the endpoints, is measured.
const Chunk = 256 << 10

// Resolver answers every name with 127.0.0.1 (a policy's IP rule lets the proxy dial it).
type Resolver struct{}

// LookupNetIP implements egress.Resolver.
func (Resolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

// Connect sends a CONNECT for target with the proxy token over c and reads the 200. The server must send
// nothing before it is asked, so nothing of the tunnel is left in a reader: c is the tunnel when it returns.
func Connect(c net.Conn, target, token string) error {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\nProxy-Authorization: Bearer "+token+"\r\n\r\n"); err != nil {
		return err
	}
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("CONNECT %s: %s", target, res.Status)
	}
	if br.Buffered() != 0 {
		return errors.New("CONNECT " + target + ": bytes after the answer")
	}
	return nil
}

// DialConnect dials the proxy at addr (a loopback address) and opens a tunnel to target through it.
func DialConnect(addr, target, token string) (net.Conn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	if err := Connect(c, target, token); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Serve is the transfer server, until c ends: 'u' reads size bytes and answers one; 'd' writes size bytes.
// It closes c.
func Serve(c net.Conn, size int) {
	defer c.Close()
	buf := make([]byte, Chunk)
	cmd := make([]byte, 1)
	for {
		if _, err := io.ReadFull(c, cmd); err != nil {
			return
		}
		switch cmd[0] {
		case 'u':
			if err := ReadN(c, buf, size); err != nil {
				return
			}
			if _, err := c.Write([]byte{'k'}); err != nil {
				return
			}
		case 'd':
			if err := WriteN(c, buf, size); err != nil {
				return
			}
		default:
			return
		}
	}
}

// Transfer is the client of Serve: one upload or one download of size bytes over c.
func Transfer(c io.ReadWriter, buf []byte, size int, upload bool) error {
	if upload {
		if _, err := c.Write([]byte{'u'}); err != nil {
			return err
		}
		if err := WriteN(c, buf, size); err != nil {
			return err
		}
		_, err := io.ReadFull(c, buf[:1])
		return err
	}
	if _, err := c.Write([]byte{'d'}); err != nil {
		return err
	}
	return ReadN(c, buf, size)
}

// ReadN reads n bytes in buf-sized calls (io.Copy into io.Discard would read 8 KiB at a time and measure the
// endpoints rather than the path).
func ReadN(r io.Reader, buf []byte, n int) error {
	for n > 0 {
		m, err := r.Read(buf[:min(n, len(buf))])
		n -= m
		if err != nil && n > 0 {
			return err
		}
	}
	return nil
}

// WriteN writes n bytes in buf-sized calls.
func WriteN(w io.Writer, buf []byte, n int) error {
	for n > 0 {
		m, err := w.Write(buf[:min(n, len(buf))])
		n -= m
		if err != nil {
			return err
		}
	}
	return nil
}
