package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"time"
)

// Domain fronting through a plain tunnel: without inspection the proxy never sees the requests, but it sees the
// client's TLS ClientHello, which names the server the client means (SNI). A CDN routes by that name, so a
// CONNECT to an allowed host whose hello names another would reach the other. checkHello reads the hello (without
// answering it: the handshake is the upstream's) and refuses a name other than the CONNECT host, and no name at
// all when the CONNECT named a host. A client that does not start with a TLS handshake record is let through:
// there is no name to front with, and its bytes go to the checked address only.

// recordHandshake is the TLS record type a ClientHello travels in.
const recordHandshake = 0x16

// errHelloRead stops the handshake once the hello is read.
var errHelloRead = errors.New("client hello read")

// checkHello waits for the client's first bytes on br (the tunnel's idle timeout; the other direction runs
// meanwhile), and when they start a TLS handshake reads the ClientHello (within headerTimeout) and checks its
// server name against v, the CONNECT's decision. What it read, and anything else buffered, is then written to up.
// false: the tunnel must end (refused, reported, or the client went away).
func (p *Proxy) checkHello(ctx context.Context, client net.Conn, br *bufio.Reader, up net.Conn, v verdict) bool {
	if p.tunnelIdle > 0 {
		_ = client.SetReadDeadline(time.Now().Add(p.tunnelIdle))
	}
	first, err := br.Peek(1)
	if err != nil {
		return false
	}
	var seen []byte
	if first[0] == recordHandshake && !p.noPeek {
		_ = client.SetReadDeadline(time.Now().Add(headerTimeout))
		var rec bytes.Buffer
		sni, ok := readHello(io.TeeReader(br, &rec))
		seen = rec.Bytes()
		switch name, _, _, nerr := NormalizeHost(sni); {
		case !ok:
			p.refuse(ctx, http.StatusForbidden, Block{Host: v.host, Port: v.port, Reason: ReasonNotTLS})
			return false
		case sni == "" && !v.isIP:
			p.refuse(ctx, http.StatusForbidden, Block{Host: v.host, Port: v.port, Reason: ReasonSNIMissing})
			return false
		case sni != "" && (nerr != nil || name != v.host):
			host := cut(sni)
			if nerr == nil {
				host = name
			}
			p.refuse(ctx, http.StatusForbidden, Block{Host: host, Port: v.port, Reason: ReasonSNIFronting})
			return false
		}
	}
	_ = client.SetReadDeadline(time.Time{})
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		seen = append(seen, b...)
		_, _ = br.Discard(n)
	}
	if len(seen) > 0 {
		_ = up.SetWriteDeadline(time.Now().Add(headerTimeout))
		if _, err := up.Write(seen); err != nil {
			return false
		}
	}
	return true
}

// readHello parses the ClientHello that r starts with and returns its server name; ok is false when r does not
// hold one. crypto/tls does the parsing: a server handshake over r that stops as soon as the hello is read, and
// writes nothing anywhere.
func readHello(r io.Reader) (sni string, ok bool) {
	cfg := &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		sni, ok = h.ServerName, true
		return nil, errHelloRead
	}}
	_ = tls.Server(readOnlyConn{r: r}, cfg).Handshake()
	return sni, ok
}

// readOnlyConn is a net.Conn that reads from r and refuses every write (the alert a stopped handshake sends).
type readOnlyConn struct {
	r io.Reader
}

func (c readOnlyConn) Read(b []byte) (int, error)     { return c.r.Read(b) }
func (readOnlyConn) Write([]byte) (int, error)        { return 0, io.ErrClosedPipe }
func (readOnlyConn) Close() error                     { return nil }
func (readOnlyConn) LocalAddr() net.Addr              { return innerAddr{} }
func (readOnlyConn) RemoteAddr() net.Addr             { return innerAddr{} }
func (readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (readOnlyConn) SetWriteDeadline(time.Time) error { return nil }
