package sandkeep_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/drivers"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/testutil"
	"github.com/sandkeep/sandkeep/internal/testutil/kubetest"
)

// forwardSandbox starts key's sandbox (the probe image, network none) with a command that runs our HTTP server
// on 127.0.0.1:8080 and our echo server on 127.0.0.1:8081 until ctx ends, and waits until both accept through
// the forward. It returns the server command's end.
func forwardSandbox(t testing.TB, m *sandkeep.Manager, key sandkeep.Key, ctx context.Context) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := m.Exec(ctx, key, sandkeep.ExecRequest{Argv: []string{"sh", "-c",
			testutil.ProbePath + " serve 127.0.0.1:8080 hello & " + testutil.ProbePath + " echo 127.0.0.1:8081 & wait"},
			Timeout: 10 * time.Minute})
		done <- err
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for _, port := range []int{8080, 8081} {
		for {
			c, err := m.DialPort(ctx, key, port, sandkeep.PortForward{Via: "test"})
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("port %d never answered through the forward: %v", port, err)
			}
			select {
			case err := <-done:
				t.Fatalf("the server command ended: %v", err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return done
}

// forwardClient is an HTTP client whose every connection is a forward to port in key's sandbox.
func forwardClient(m *sandkeep.Manager, key sandkeep.Key, port int, pf sandkeep.PortForward) *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return m.DialPort(ctx, key, port, pf) }}}
}

// TestPortForwardChannel: with the sandbox's agent channel served by this process, forwarded connections are
// streams on that channel, not engine execs: our HTTP server, started by a command in a sandbox with network
// mode none and no route, answers many connections at once through the forward while that command holds the
// user's gate; tens of MiB go both ways at once through our echo server, intact; every connection is recorded
// with transport "agent"; and an open forward ends when the sandbox stops. On kubernetes the same, over the
// pod's channel (one session side for both drivers: internal/channel's Slot).
func TestPortForwardChannel(t *testing.T) {
	cfg := baseConfig(t)
	if onKube {
		cfg.Image = kubetest.ProbeImage // imported into the node with the other test images
	} else {
		cfg.Image = testutil.ProbeImage(t)
	}
	cfg.Transport = "auto" // the channel when it is up (SANDKEEP_TRANSPORT=exec would force the fallback)
	wantTransport := "agent"
	if cfg.Runtime == "runsc" {
		wantTransport = "exec" // no channel under gVisor (internal/engine/lifecycle/transport.go)
	}
	s := newSuite(t, cfg)
	key := s.key("pf", "u")

	if !onKube { // a pod has its pod network, closed by the isolation NetworkPolicy (the kubernetes egress suite)
		// No way out: only loopback, no route, network mode none (read, never dialled).
		r := s.exec(s.m, key, "sh", "-c", `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; echo routes=$(tail -n +2 /proc/net/route | wc -l)`)
		if got := strings.Join(strings.Fields(r.Stdout), " "); got != "lo routes=0" {
			t.Fatalf("interfaces and routes in the sandbox: %q", r.Stdout)
		}
		ins, err := s.cli.ContainerInspect(t.Context(), key.ContainerName(), client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if mode := string(ins.Container.HostConfig.NetworkMode); mode != "none" {
			t.Fatalf("network mode %q, want none", mode)
		}
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	served := forwardSandbox(t, s.m, key, ctx)

	var mu sync.Mutex
	var opened []events.PortForwardOpened
	pf := sandkeep.PortForward{Via: "test", OnEvent: func(name string, payload any) {
		if ev, ok := payload.(events.PortForwardOpened); ok {
			mu.Lock()
			opened = append(opened, ev)
			mu.Unlock()
		}
	}}
	hc := forwardClient(s.m, key, 8080, pf)
	const parallel = 24
	var wg sync.WaitGroup
	errs := make(chan error, parallel+2)
	for i := range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := hc.Get(fmt.Sprintf("http://sandbox/conn-%d", i))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err == nil && string(body) != fmt.Sprintf("hello /conn-%d", i) {
				err = fmt.Errorf("body %q", body)
			}
			errs <- err
		}()
	}
	for range 2 { // meanwhile, 24 MiB each way on two more connections
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- echoThrough(ctx, s.m, key, 24<<20, pf)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	if len(opened) != parallel+2 {
		t.Fatalf("%d port_forward_opened events, want %d", len(opened), parallel+2)
	}
	for _, ev := range opened {
		if ev.Transport != wantTransport || ev.Port == 0 || ev.Via != "test" {
			t.Fatalf("port_forward_opened %+v, want transport %q", ev, wantTransport)
		}
	}
	mu.Unlock()

	// The sandbox stops (the engine stops it, as an operator or the host would): an open forward ends.
	idle, err := s.m.DialPort(ctx, key, 8081, pf)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if onKube {
		sb := s.sandboxNamed(key.ContainerName())
		if sb == nil {
			t.Fatal("no sandbox to stop")
		}
		if err := s.kd.Stop(t.Context(), sb, time.Second); err != nil {
			t.Fatal(err)
		}
	} else if _, err := s.cli.ContainerStop(t.Context(), key.ContainerName(), client.ContainerStopOptions{}); err != nil {
		t.Fatal(err)
	}
	_ = idle.SetReadDeadline(time.Now().Add(slack))
	if n, err := idle.Read(make([]byte, 1)); err == nil || os.IsTimeout(err) {
		t.Fatalf("an open forward after the sandbox stopped: read %d bytes, %v", n, err)
	}
	select {
	case <-served:
	case <-time.After(slack):
		t.Fatal("the server command did not end when the sandbox stopped")
	}
	// The command's channel broke with it, so the sandbox may have been recycled away meanwhile.
	if _, err := s.m.DialPort(ctx, key, 8081, pf); sandkeep.CodeOf(err) != "SANDBOX_NOT_RUNNING" && sandkeep.CodeOf(err) != "SANDBOX_NOT_FOUND" {
		t.Fatalf("a forward to a stopped sandbox: %v, want SANDBOX_NOT_RUNNING or SANDBOX_NOT_FOUND", err)
	}
}

// echoThrough sends size random bytes to the echo server on 8081 through a forward, half-closes, and checks
// that the same bytes (SHA-256) come back before EOF, both directions at once.
func echoThrough(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key, size int, pf sandkeep.PortForward) error {
	c, err := m.DialPort(ctx, key, 8081, pf)
	if err != nil {
		return err
	}
	defer c.Close()
	data := make([]byte, size)
	_, _ = rand.Read(data)
	want := sha256.Sum256(data)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(interface{ CloseWrite() error }).CloseWrite()
		}
		werr <- err
	}()
	h := sha256.New()
	n, err := io.Copy(h, c)
	if err != nil {
		return fmt.Errorf("echo: read back after %d bytes: %w", n, err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("echo: write: %w", err)
	}
	if n != int64(size) || !bytes.Equal(h.Sum(nil), want[:]) {
		return fmt.Errorf("echo: %d bytes came back, want %d (hash equal: %v)", n, size, bytes.Equal(h.Sum(nil), want[:]))
	}
	return nil
}

// BenchmarkPortForwardSideBySide: one forwarded HTTP request (a new connection, GET, the whole answer) over the
// agent channel against the same request over the fallback, one engine exec of the agent per connection, in
// one run on one sandbox: blocks of 10 requests per side, the order of the sides rotating from block to block,
// medians per side and their ratio. Also 8 MiB echoed through each (MB/s, medians).
//
//	SANDKEEP_REQUIRE_DOCKER=1 go test -run '^$' -bench PortForwardSideBySide -benchtime 1x .
func BenchmarkPortForwardSideBySide(b *testing.B) {
	testutil.Docker(b)
	cfg := sandkeep.Config{
		Home: b.TempDir(), Image: testutil.ProbeImage(b), AgentPath: testutil.AgentBinary(b), Grace: grace,
		Drivers: []sandkeep.DriverOption{drivers.Docker()}, Transport: "auto", NoSweeper: true,
	}
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	m, err := sandkeep.Open(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	testutil.Cleanup(b, m.Installation())
	defer m.Close()
	key, err := sandkeep.NewKey("pf-bench-"+randHex(4), "u")
	if err != nil {
		b.Fatal(err)
	}
	served := forwardSandbox(b, m, key, ctx)
	defer func() { cancel(); <-served }()

	var transports sync.Map
	pf := sandkeep.PortForward{Via: "bench", OnEvent: func(_ string, payload any) {
		if ev, ok := payload.(events.PortForwardOpened); ok {
			transports.Store(ev.Transport, true)
		}
	}}
	dials := [2]func(ctx context.Context) (net.Conn, error){
		func(ctx context.Context) (net.Conn, error) { return m.DialPort(ctx, key, 8080, pf) },
		func(ctx context.Context) (net.Conn, error) { return sandkeep.DialPortExec(ctx, m, key, 8080) },
	}
	names := [2]string{"channel", "exec"}
	request := func(side int) time.Duration {
		hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dials[side](ctx) }}}
		start := time.Now()
		resp, err := hc.Get("http://sandbox/bench")
		if err != nil {
			b.Fatalf("%s: %v", names[side], err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(body) != "hello /bench" {
			b.Fatalf("%s: %q %v", names[side], body, err)
		}
		return time.Since(start)
	}
	const echoBytes = 8 << 20
	data := make([]byte, echoBytes)
	echo := func(side int) float64 { // MB/s, both directions at once
		c, err := func() (net.Conn, error) {
			if side == 0 {
				return m.DialPort(ctx, key, 8081, pf)
			}
			return sandkeep.DialPortExec(ctx, m, key, 8081)
		}()
		if err != nil {
			b.Fatalf("%s: %v", names[side], err)
		}
		defer c.Close()
		start := time.Now()
		go func() {
			_, _ = c.Write(data)
			_ = c.(interface{ CloseWrite() error }).CloseWrite()
		}()
		n, err := io.Copy(io.Discard, c)
		if err != nil || n != echoBytes {
			b.Fatalf("%s: echoed %d bytes, %v", names[side], n, err)
		}
		return float64(2*echoBytes) / 1e6 / time.Since(start).Seconds()
	}
	const blocks, perBlock = 6, 10
	var lat [2][]float64
	var mbs [2][]float64
	for range b.N {
		for blk := range blocks {
			for j := range 2 {
				side := (blk + j) % 2 // rotate which side goes first
				for range perBlock {
					lat[side] = append(lat[side], float64(request(side).Microseconds())/1000)
				}
				mbs[side] = append(mbs[side], echo(side))
			}
		}
	}
	if _, ok := transports.Load("agent"); !ok {
		b.Fatal("no forward went over the agent channel")
	}
	med := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(med(lat[0]), "channel-ms/req")
	b.ReportMetric(med(lat[1]), "exec-ms/req")
	b.ReportMetric(med(lat[0])/med(lat[1]), "channel/exec")
	b.ReportMetric(med(mbs[0]), "channel-MB/s")
	b.ReportMetric(med(mbs[1]), "exec-MB/s")
}
