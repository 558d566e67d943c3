package egress

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/benchnet"
)

// BenchmarkForwardBody is the plain-HTTP path's throughput: a GET of 64 MiB through the proxy (absolute form,
// the proxy's ReverseProxy copying the body) against the same GET direct, the two alternating every iteration
// (the order rotating), with the medians and their ratio:
//
//	go test -run x -bench ForwardBody -benchtime 15x ./internal/egress/
func BenchmarkForwardBody(b *testing.B) {
	chunk := make([]byte, 256<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = benchnet.WriteN(w, chunk, tunnelBytes)
	}))
	b.Cleanup(srv.Close)
	_, paddr := benchProxy(b, InspectOff)
	port := srv.URL[len("http://127.0.0.1:"):]
	proxyURL := &url.URL{Scheme: "http", User: url.UserPassword("sandkeep", testToken), Host: paddr}
	clients := [2]*http.Client{
		{Transport: &http.Transport{}},                               // direct
		{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}, // through the proxy
	}
	urls := [2]string{srv.URL + "/", "http://bench.test:" + port + "/"}
	buf := make([]byte, 256<<10)
	get := func(i int) time.Duration {
		start := time.Now()
		res, err := clients[i].Get(urls[i])
		if err != nil {
			b.Fatal(err)
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			b.Fatalf("%s: %s", urls[i], res.Status)
		}
		if err := benchnet.ReadN(res.Body, buf, tunnelBytes); err != nil {
			b.Fatal(err)
		}
		if n, _ := res.Body.Read(buf[:1]); n != 0 {
			b.Fatal("more than the body")
		}
		return time.Since(start)
	}
	var ts [2][]time.Duration
	block := 0
	b.SetBytes(2 * tunnelBytes)
	for b.Loop() {
		for i := range 2 {
			v := (i + block) % 2
			ts[v] = append(ts[v], get(v))
		}
		block++
	}
	d, p := median(ts[0]), median(ts[1])
	b.ReportMetric(float64(tunnelBytes)/1e6/d.Seconds(), "direct-MB/s")
	b.ReportMetric(float64(tunnelBytes)/1e6/p.Seconds(), "proxy-MB/s")
	b.ReportMetric(float64(d)/float64(p), "ratio")
}
