package egress

import (
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// BenchmarkTunnelSideBySide is issue 12's throughput bar: the proxy's plain tunnel against a direct loopback
// copy to the same server, measured side by side in one run. Each iteration is one block that moves
// tunnelBytes each way over both paths, in an order that rotates every block (direct first, then proxy first),
// so that a burst of load on the shared machine hits both. It reports the medians over the blocks and the
// ratio of the medians, and the median of the per-block ratios (what the bar is judged on: both halves of a
// ratio come from the same moment):
//
//	go test -run x -bench TunnelSideBySide -benchtime 9x ./internal/egress/
func BenchmarkTunnelSideBySide(b *testing.B) {
	up := tcpServer(b, func(c net.Conn) {
		buf := make([]byte, 256<<10)
		cmd := make([]byte, 1)
		for {
			if _, err := io.ReadFull(c, cmd); err != nil {
				return
			}
			switch cmd[0] {
			case 'u':
				if err := drain(c, buf, tunnelBytes); err != nil {
					return
				}
				if _, err := c.Write([]byte{'k'}); err != nil {
					return
				}
			case 'd':
				for left := tunnelBytes; left > 0; left -= len(buf) {
					if _, err := c.Write(buf[:min(left, len(buf))]); err != nil {
						return
					}
				}
			}
		}
	})
	_, paddr := benchProxy(b, InspectOff)
	direct, err := net.Dial("tcp", up)
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close()
	pc, br, err := dialConnect(paddr, "bench.test:"+up[len("127.0.0.1:"):])
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Close()
	conns := [2]io.ReadWriter{direct, struct {
		io.Reader
		io.Writer
	}{br, pc}}

	buf := make([]byte, 256<<10)
	// move sends tunnelBytes over c (upload) or receives them (download) and returns MB/s.
	move := func(c io.ReadWriter, upload bool) float64 {
		start := time.Now()
		if upload {
			if _, err := c.Write([]byte{'u'}); err != nil {
				b.Fatal(err)
			}
			for left := tunnelBytes; left > 0; left -= len(buf) {
				if _, err := c.Write(buf[:min(left, len(buf))]); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := io.ReadFull(c, buf[:1]); err != nil {
				b.Fatal(err)
			}
		} else {
			if _, err := c.Write([]byte{'d'}); err != nil {
				b.Fatal(err)
			}
			if err := drain(c, buf, tunnelBytes); err != nil {
				b.Fatal(err)
			}
		}
		return float64(tunnelBytes) / 1e6 / time.Since(start).Seconds()
	}
	// rate[dir][via]: dir 0 upload, 1 download; via 0 direct, 1 proxy. ratio[dir]: proxy/direct per block.
	var rate [2][2][]float64
	var ratio [2][]float64
	block := 0
	b.SetBytes(4 * tunnelBytes)
	for b.Loop() {
		for dir := range 2 {
			var got [2]float64
			for i := range 2 {
				via := (i + block) % 2 // rotate: even blocks direct first, odd blocks proxy first
				got[via] = move(conns[via], dir == 0)
			}
			rate[dir][0] = append(rate[dir][0], got[0])
			rate[dir][1] = append(rate[dir][1], got[1])
			ratio[dir] = append(ratio[dir], got[1]/got[0])
		}
		block++
	}
	for dir, name := range []string{"up", "down"} {
		d, p := medianF(rate[dir][0]), medianF(rate[dir][1])
		b.ReportMetric(d, name+"-direct-MB/s")
		b.ReportMetric(p, name+"-proxy-MB/s")
		b.ReportMetric(p/d, name+"-ratio-of-medians")
		b.ReportMetric(medianF(ratio[dir]), name+"-median-block-ratio")
	}
}

func medianF(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
