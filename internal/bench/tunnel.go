package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/benchnet"
	"github.com/sandkeep/sandkeep/internal/channel"
	"github.com/sandkeep/sandkeep/internal/egress"
)

// Sizes of the tunnel scenario.
const (
	DefaultTunnelN = 15       // blocks; each moves TunnelBytes up and down over both paths
	TunnelBytes    = 64 << 20 // one transfer
)

// Tunnel: the egress proxy's throughput (issue 12's bar: at least 60% of a direct loopback copy), side by side.
// The path is the host's half of a sandbox's, in production code: the proxy (egress.Proxy, plain tunnel, the
// ClientHello check on as for every tunnel) serves a channel.SideListener on an e.sock in a temporary directory,
// and what stands in for the sandbox's init accepts the client's connection on a loopback address and hands the
// socket itself to e.sock, as init does (channel.HandOff). The client then CONNECTs to a loopback server and
// moves TunnelBytes up (the server reads them all and answers one byte) and down (the server writes them on a
// one-byte request). The baseline is the same client and the same server over one direct loopback connection.
// A third path is the same tunnel with init copying the bytes over its Unix connection instead (the path before
// the handoff, and init's fallback where descriptors do not pass). A fourth is the control: a minimal relay, two
// TCP sockets and io.Copy (splice) each way with nothing else, the least any userspace forward proxy costs on
// this machine. Each of n blocks times one upload and one download over the four, the order rotating every
// block; the rows report the transfer times (ratio: proxy over direct, lower is better) and, in the notes, the
// throughputs, the throughput ratio of the medians (direct time / proxy time: the bar), the median of the
// per-block ratios and, for the proxy, its throughput over the minimal relay's in the same blocks.
// What is not in it: the sandbox's network namespace (the same kernel's loopback) and the command's exec.
func Tunnel(ctx context.Context, n int) ([]Result, error) { return tunnel(ctx, n, TunnelBytes) }

func tunnel(ctx context.Context, blocks, size int) (_ []Result, err error) {
	var wg sync.WaitGroup
	defer wg.Wait()

	// The server, the same for both paths.
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	var connsMu sync.Mutex
	var conns []net.Conn
	defer func() {
		connsMu.Lock()
		for _, c := range conns {
			c.Close()
		}
		connsMu.Unlock()
	}()
	wg.Go(func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			connsMu.Lock()
			conns = append(conns, c)
			connsMu.Unlock()
			wg.Go(func() { benchnet.Serve(c, size) })
		}
	})

	// The proxy on its side listener, as lifecycle serves a key's.
	dir, err := os.MkdirTemp("", "skbt") // short: a Unix socket's path holds 107 bytes
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	token := hex.EncodeToString(tok[:])
	rules, rerrs := egress.ParseRules([]string{"bench.test", "127.0.0.1"})
	if rerrs != nil {
		return nil, rerrs[0]
	}
	p, err := egress.New(egress.Config{Policy: egress.Policy{Mode: egress.ModeAllowlist, Rules: rules, Inspect: egress.InspectOff},
		Token: token, Resolver: benchnet.Resolver{}})
	if err != nil {
		return nil, err
	}
	side, err := channel.ListenSide(dir, channel.EgressSocketName, func(pid int) bool { return pid == os.Getpid() }, nil)
	if err != nil {
		return nil, err
	}
	wg.Go(func() { _ = p.Serve(side) })
	defer p.Close()

	// Init's part: the sandbox's proxy address. The first connection is handed to e.sock as init does; the
	// second is copied by init over its own connection to e.sock (the path before the handoff, and init's
	// fallback where the runtime passes no descriptor, as gVisor's): a third path, for what the handoff saves.
	initLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer initLn.Close()
	sock := filepath.Join(dir, channel.EgressSocketName)
	handed := make(chan error, 2)
	wg.Go(func() {
		c, err := initLn.Accept()
		if err != nil {
			handed <- err
			return
		}
		defer c.Close()
		u, err := channel.Dial(sock, 5*time.Second)
		if err != nil {
			handed <- err
			return
		}
		defer u.Close()
		answer, err := channel.HandOff(u.(*net.UnixConn), c.(*net.TCPConn))
		if err == nil && answer != channel.HandoffTaken {
			err = errors.New("the host did not take the socket")
		}
		handed <- err
	})
	proxied, err := net.Dial("tcp", initLn.Addr().String())
	if err != nil {
		return nil, err
	}
	defer proxied.Close()
	if err := <-handed; err != nil {
		return nil, fmt.Errorf("tunnel: handoff: %w", err)
	}
	wg.Go(func() {
		c, err := initLn.Accept()
		if err != nil {
			handed <- err
			return
		}
		u, err := channel.Dial(sock, 5*time.Second)
		if err == nil {
			_, err = u.Write([]byte{channel.StreamMarker})
		}
		handed <- err
		if err != nil {
			c.Close()
			return
		}
		copyBoth(c, u) // as init's copyHalf does: splice each way, until either side ends
	})
	copied, err := net.Dial("tcp", initLn.Addr().String())
	if err != nil {
		return nil, err
	}
	defer copied.Close()
	if err := <-handed; err != nil {
		return nil, fmt.Errorf("tunnel: stream: %w", err)
	}
	direct, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		return nil, err
	}
	defer direct.Close()
	relayed, err := minimalRelay(&wg, srv.Addr().String())
	if err != nil {
		return nil, err
	}
	defer relayed.Close()
	_, port, _ := net.SplitHostPort(srv.Addr().String())
	for _, c := range []net.Conn{proxied, copied} {
		if err := benchnet.Connect(c, "bench.test:"+port, token); err != nil {
			return nil, fmt.Errorf("tunnel: %w", err)
		}
	}

	// times[dir][via][block]: dir 0 upload, 1 download; via 0 handed off, 1 direct, 2 copied by init, 3 the
	// minimal relay. The per-block ratios are taken from it (blockRatios).
	via := [4]net.Conn{proxied, direct, copied, relayed}
	var times [2][4][]time.Duration
	buf := make([]byte, benchnet.Chunk)
	for block := range blocks {
		for dir := range 2 {
			var got [4]time.Duration
			for i := range len(via) {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				v := (i + block) % len(via) // the order rotates every block
				start := time.Now()
				if err := benchnet.Transfer(via[v], buf, size, dir == 0); err != nil {
					return nil, fmt.Errorf("tunnel: %w", err)
				}
				got[v] = time.Since(start)
			}
			for v := range len(via) {
				times[dir][v] = append(times[dir][v], got[v])
			}
		}
	}
	mbps := func(d time.Duration) string { return fmt.Sprintf("%.0f", float64(size)/1e6/d.Seconds()) }
	out := make([]Result, 0, 6)
	for _, path := range []struct {
		v    int
		name string
	}{{0, "socket handed off"}, {2, "init copying, the fallback"}, {3, "control: a minimal splice relay, no proxy"}} {
		for dir, name := range []string{"upload", "download"} {
			r := newResult(fmt.Sprintf("egress tunnel %s, %d MiB (CONNECT, hello checked, %s)", name, size>>20, path.name),
				"direct loopback copy, same client and server", times[dir][path.v], times[dir][1])
			r.Extra = map[string]string{
				"proxy_MBps":         mbps(r.Sandkeep.Median),
				"direct_MBps":        mbps(r.Base.Median),
				"throughput_ratio":   fmt.Sprintf("%.2f", float64(r.Base.Median)/float64(r.Sandkeep.Median)),
				"median_block_ratio": fmt.Sprintf("%.2f", medianFloat(blockRatios(times[dir][1], times[dir][path.v]))),
			}
			if path.v == 0 {
				r.Extra["bar"] = ">=0.60"
				r.Extra["of_minimal_relay"] = fmt.Sprintf("%.2f", medianFloat(blockRatios(times[dir][3], times[dir][0])))
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// minimalRelay is the control path: a loopback listener whose one connection is relayed to server by copyBoth,
// on goroutines counted in wg, and the client's connection to it.
func minimalRelay(wg *sync.WaitGroup, server string) (net.Conn, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- err
			return
		}
		up, err := net.Dial("tcp", server)
		if err != nil {
			c.Close()
			accepted <- err
			return
		}
		accepted <- nil
		copyBoth(c, up)
	})
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	if err := <-accepted; err != nil {
		c.Close()
		return nil, fmt.Errorf("tunnel: minimal relay: %w", err)
	}
	return c, nil
}

// copyBoth copies both ways between a and b and closes both when either direction ends.
func copyBoth(a, b net.Conn) {
	done := make(chan struct{}, 2)
	for _, p := range [][2]net.Conn{{a, b}, {b, a}} {
		go func() {
			_, _ = io.Copy(p[0], p[1])
			done <- struct{}{}
		}()
	}
	<-done
	a.Close()
	b.Close()
	<-done
}

// blockRatios is num[i]/den[i] for each block i: with times, the throughput of den's path over num's, both
// halves taken in the same block.
func blockRatios(num, den []time.Duration) []float64 {
	r := make([]float64, len(num))
	for i := range num {
		r[i] = float64(num[i]) / float64(den[i])
	}
	return r
}

func medianFloat(v []float64) float64 {
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
