package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/benchnet"
)

// The benchmarks compare the proxy with the direct path to the same loopback server, side by side:
//
//	go test -run x -bench . -benchtime 2000x ./internal/egress/
//
// BenchmarkConnect: a CONNECT answered 200 (resolve, decide, dial) vs a direct TCP connect; "paired" times
// both alternately and reports the medians and the added latency. BenchmarkTunnel: 64 MiB per op through an
// open tunnel vs a direct connection. BenchmarkRequests: keep-alive HTTPS requests/s, direct vs through a
// plain tunnel vs TLS-inspected (HTTP/1.1 and HTTP/2). BenchmarkIdleProxy: memory per serving, idle proxy.

func benchRules(in ...string) []Rule {
	rs, errs := ParseRules(in)
	if errs != nil {
		panic(errs[0])
	}
	return rs
}

// benchProxy serves a proxy allowing bench.test and api.test (both 127.0.0.1, unlocked by an IP rule).
func benchProxy(b *testing.B, inspect string) (*Proxy, string) {
	b.Helper()
	p, err := New(Config{
		Policy:        Policy{Mode: ModeAllowlist, Rules: benchRules("bench.test", "api.test", "127.0.0.1"), Inspect: inspect},
		Token:         testToken,
		Resolver:      benchnet.Resolver{},
		UpstreamRoots: testPKI(b).roots,
	})
	if err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Serve(l) }()
	b.Cleanup(func() { _ = p.Close(); <-done })
	return p, l.Addr().String()
}

// tcpServer accepts connections and hands each to serve, until the benchmark ends.
func tcpServer(b *testing.B, serve func(net.Conn)) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	b.Cleanup(func() { _ = l.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { defer c.Close(); serve(c) })
		}
	})
	return l.Addr().String()
}

// dialConnect opens a tunnel to target through the proxy at addr, with the test token.
func dialConnect(addr, target string) (net.Conn, error) {
	return benchnet.DialConnect(addr, target, testToken)
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func BenchmarkConnect(b *testing.B) {
	up := tcpServer(b, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	_, paddr := benchProxy(b, InspectOff)
	target := "bench.test:" + up[len("127.0.0.1:"):]
	direct := func() error {
		c, err := net.Dial("tcp", up)
		if err == nil {
			c.Close()
		}
		return err
	}
	proxied := func() error {
		c, err := dialConnect(paddr, target)
		if err == nil {
			c.Close()
		}
		return err
	}
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if err := direct(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proxy", func(b *testing.B) {
		for b.Loop() {
			if err := proxied(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("paired", func(b *testing.B) {
		var ds, ps []time.Duration
		for b.Loop() {
			t0 := time.Now()
			if err := direct(); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := proxied(); err != nil {
				b.Fatal(err)
			}
			ds, ps = append(ds, t1.Sub(t0)), append(ps, time.Since(t1))
		}
		md, mp := median(ds), median(ps)
		b.ReportMetric(float64(md.Nanoseconds()), "direct-p50-ns")
		b.ReportMetric(float64(mp.Nanoseconds()), "proxy-p50-ns")
		b.ReportMetric(float64((mp - md).Nanoseconds()), "added-p50-ns")
		b.ReportMetric(float64(mp)/float64(md), "proxy/direct")
	})
}

const tunnelBytes = 64 << 20

// BenchmarkTunnel moves 64 MiB per op over one open connection, direct or through a CONNECT tunnel: upload
// (the server reads it all, then acks a byte) and download (the server writes it all on a one-byte request).
func BenchmarkTunnel(b *testing.B) {
	up := tcpServer(b, func(c net.Conn) { benchnet.Serve(c, tunnelBytes) })
	_, paddr := benchProxy(b, InspectOff)
	target := "bench.test:" + up[len("127.0.0.1:"):]
	open := map[string]func() (io.ReadWriteCloser, error){
		"direct": func() (io.ReadWriteCloser, error) { return net.Dial("tcp", up) },
		"proxy": func() (io.ReadWriteCloser, error) {
			return dialConnect(paddr, target)
		},
	}
	for _, dir := range []string{"upload", "download"} {
		for _, via := range []string{"direct", "proxy"} {
			b.Run(dir+"/"+via, func(b *testing.B) {
				c, err := open[via]()
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				buf := make([]byte, benchnet.Chunk)
				b.SetBytes(tunnelBytes)
				for b.Loop() {
					if err := benchnet.Transfer(c, buf, tunnelBytes, dir == "upload"); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkRequests: sequential keep-alive GETs of a small response over HTTPS, reported as req/s.
func BenchmarkRequests(b *testing.B) {
	up := newUpstream(b, true)
	upAddr := up.Listener.Addr().String()
	port := up.port()
	url_ := "https://api.test:" + port + "/r"

	clientFor := func(b *testing.B, proxyAddr string, roots *x509.CertPool, h2 bool) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, MaxIdleConnsPerHost: 1}
		if proxyAddr != "" {
			tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", User: url.UserPassword("s", testToken), Host: proxyAddr})
		} else {
			tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, upAddr)
			}
		}
		tr.Protocols = new(http.Protocols)
		if h2 {
			tr.Protocols.SetHTTP2(true)
		} else {
			tr.Protocols.SetHTTP1(true)
		}
		b.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	run := func(b *testing.B, c *http.Client) {
		get := func() {
			resp, err := c.Get(url_)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatal(resp.Status)
			}
		}
		get() // the connection (and the proxy's upstream connection) is made outside the timing
		start := time.Now()
		for b.Loop() {
			get()
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
	}
	for _, h2 := range []bool{false, true} {
		proto := "h1"
		if h2 {
			proto = "h2"
		}
		b.Run("direct/"+proto, func(b *testing.B) {
			run(b, clientFor(b, "", testPKI(b).roots, h2))
		})
		b.Run("tunnel/"+proto, func(b *testing.B) {
			_, paddr := benchProxy(b, InspectOff)
			run(b, clientFor(b, paddr, testPKI(b).roots, h2))
		})
		b.Run("inspected/"+proto, func(b *testing.B) {
			p, paddr := benchProxy(b, InspectOn)
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(p.CACert())
			run(b, clientFor(b, paddr, roots, h2))
		})
	}
}

// BenchmarkIdleProxy serves n proxies, each on its own Unix socket, and reports what one costs idle: heap,
// goroutine stacks, and goroutines. "inspect" proxies have made their CA (CACert).
func BenchmarkIdleProxy(b *testing.B) {
	const n = 200
	for _, inspect := range []string{InspectOff, InspectOn} {
		name := "plain"
		if inspect == InspectOn {
			name = "inspect"
		}
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			var heap, stack, gor float64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				g0 := runtime.NumGoroutine()
				proxies := make([]*Proxy, 0, n)
				var wg sync.WaitGroup
				for i := range n {
					p, err := New(Config{
						Policy: Policy{Mode: ModeAllowlist, Rules: benchRules("**.example.com", "registry.npmjs.org"), Inspect: inspect},
						Token:  "token-" + strconv.Itoa(i),
					})
					if err != nil {
						b.Fatal(err)
					}
					l, err := net.Listen("unix", filepath.Join(dir, strconv.Itoa(i)+".sock"))
					if err != nil {
						b.Fatal(err)
					}
					if inspect == InspectOn {
						_ = p.CACert()
					}
					wg.Go(func() { _ = p.Serve(l) })
					proxies = append(proxies, p)
				}
				time.Sleep(50 * time.Millisecond) // every Serve is in Accept
				runtime.GC()
				runtime.ReadMemStats(&after)
				heap = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
				stack = float64(int64(after.StackInuse)-int64(before.StackInuse)) / n
				gor = float64(runtime.NumGoroutine()-g0) / n
				for _, p := range proxies {
					_ = p.Close()
				}
				wg.Wait()
			}
			b.ReportMetric(heap, "heap-B/proxy")
			b.ReportMetric(stack, "stack-B/proxy")
			b.ReportMetric(heap+stack, "B/proxy")
			b.ReportMetric(gor, "goroutines/proxy")
		})
	}
}
