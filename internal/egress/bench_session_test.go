package egress

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"strconv"
	"testing"
	"time"
)

// clientHello is the first flight of a Go TLS client for name: what a plain tunnel's hello check reads.
func clientHello(b *testing.B, name string) []byte {
	b.Helper()
	var out bytes.Buffer
	c := tls.Client(writeOnlyConn{&out}, &tls.Config{ServerName: name, InsecureSkipVerify: true})
	_ = c.SetDeadline(time.Now().Add(time.Second))
	_ = c.Handshake() // fails reading the answer; the hello is written
	if out.Len() == 0 {
		b.Fatal("no hello written")
	}
	return out.Bytes()
}

type writeOnlyConn struct{ w *bytes.Buffer }

func (c writeOnlyConn) Write(p []byte) (int, error)    { return c.w.Write(p) }
func (writeOnlyConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (writeOnlyConn) Close() error                     { return nil }
func (writeOnlyConn) LocalAddr() net.Addr              { return innerAddr{} }
func (writeOnlyConn) RemoteAddr() net.Addr             { return innerAddr{} }
func (writeOnlyConn) SetDeadline(time.Time) error      { return nil }
func (writeOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (writeOnlyConn) SetWriteDeadline(time.Time) error { return nil }

// BenchmarkSNIPeek: a CONNECT whose client sends a TLS ClientHello and waits for the upstream's first byte, through
// a proxy that checks the hello and one that does not (noPeek), alternating in one run; reports the medians and
// what the check adds.
func BenchmarkSNIPeek(b *testing.B) {
	up := tcpServer(b, func(c net.Conn) {
		hdr := make([]byte, 5)
		if _, err := io.ReadFull(c, hdr); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, c, int64(hdr[3])<<8|int64(hdr[4])); err != nil {
			return
		}
		_, _ = c.Write([]byte{'k'})
	})
	on, onAddr := benchProxy(b, InspectOff)
	off, offAddr := benchProxy(b, InspectOff)
	ForBench(off, BenchOff{HelloCheck: true})
	_ = on
	target := "bench.test:" + up[len("127.0.0.1:"):]
	hello := clientHello(b, "bench.test")
	once := func(addr string) (time.Duration, error) {
		t0 := time.Now()
		c, err := dialConnect(addr, target)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		if _, err := c.Write(hello); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			return 0, err
		}
		return time.Since(t0), nil
	}
	var ons, offs []time.Duration
	i := 0
	for b.Loop() {
		first, second, a, bb := onAddr, offAddr, &ons, &offs
		if i%2 == 1 { // rotate the order
			first, second, a, bb = offAddr, onAddr, &offs, &ons
		}
		i++
		d1, err := once(first)
		if err != nil {
			b.Fatal(err)
		}
		d2, err := once(second)
		if err != nil {
			b.Fatal(err)
		}
		*a, *bb = append(*a, d1), append(*bb, d2)
	}
	mOn, mOff := median(ons), median(offs)
	b.ReportMetric(float64(mOff.Nanoseconds()), "nopeek-p50-ns")
	b.ReportMetric(float64(mOn.Nanoseconds()), "peek-p50-ns")
	b.ReportMetric(float64((mOn - mOff).Nanoseconds()), "added-p50-ns")
}

// BenchmarkSession: what a per-command session costs a warm exec on the proxy: Begin (compile the policy, fresh
// token, close what the last one left) and End, against setting the same policy again (the old per-command path),
// alternating in one run.
func BenchmarkSession(b *testing.B) {
	p, _ := benchProxy(b, InspectOff)
	pol := Policy{Mode: ModeAllowlist, Rules: benchRules("bench.test", "api.test", "127.0.0.1"),
		Credentials: []Credential{{Name: "K", Placeholder: NewPlaceholder("K"), Value: "value-of-k-1234", Hosts: benchRules("api.test")}}}
	var sess, same []time.Duration
	i := 0
	for b.Loop() {
		t0 := time.Now()
		if err := p.Begin(pol, "token-"+strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
		p.End()
		t1 := time.Now()
		if err := p.SetPolicy(pol); err != nil {
			b.Fatal(err)
		}
		if err := p.SetPolicy(pol); err != nil { // the second is what the old path did per command: unchanged
			b.Fatal(err)
		}
		sess, same = append(sess, t1.Sub(t0)), append(same, time.Since(t1)/2)
		i++
	}
	b.ReportMetric(float64(median(sess).Nanoseconds()), "begin+end-p50-ns")
	b.ReportMetric(float64(median(same).Nanoseconds()), "setpolicy-same-p50-ns")
}
