package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/testutil"
)

// started is a long-running sandkeep process whose stdout is read line by line.
type started struct {
	cmd   *exec.Cmd
	lines chan string
	err   strings.Builder
	mu    sync.Mutex
	done  chan struct{}
}

func (c *cli) start(t *testing.T, args ...string) *started {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), processBound)
	cmd := c.command(ctx, nil, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &started{cmd: cmd, lines: make(chan string, 100), done: make(chan struct{})}
	cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.err.Write(p)
	})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(s.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
	}()
	go func() { _ = cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-s.done
		cancel()
	})
	return s
}

// line waits for a stdout line starting with prefix.
func (s *started) line(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case l, ok := <-s.lines:
			if !ok {
				t.Fatalf("exited before printing %q; stderr: %s", prefix, s.stderr())
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timeout:
			t.Fatalf("never printed %q; stderr: %s", prefix, s.stderr())
		}
	}
}

func (s *started) stderr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err.String()
}

// wait waits for the process to exit and returns its exit code.
func (s *started) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(within):
		t.Fatalf("still running after %v; stderr: %s", within, s.stderr())
	}
	return s.cmd.ProcessState.ExitCode()
}

func get(t *testing.T, url string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestPortForward: an HTTP server of ours, started by a command in a sandbox with no network, is reached from
// the host through `sandkeep port-forward`, many connections at once, while that command still holds the user's
// gate; the sandbox still has network mode none and only a loopback interface; a port nothing listens on is
// PORT_UNREACHABLE for that connection only; each connection is recorded; the forward ends when the sandbox
// stops.
func TestPortForward(t *testing.T) {
	c := newCLI(t)
	c.env = append(c.env, "SANDKEEP_IMAGE="+testutil.ProbeImage(t)) // the last value wins
	// In the suite's daemon pass, newCLI's first call started the home's daemon with the suite's image; the
	// calls below start their own with the probe image (another one would send them in-process: a mismatch).
	if _, err := c.exec(t.Context(), nil, nil, "daemon", "stop"); err != nil {
		t.Fatal(err)
	}
	tenant := c.ten("pf")
	who := []string{"--tenant", tenant, "--user", "u"}

	server := c.start(t, append(append([]string{"exec"}, who...), "--timeout", "5m", "--",
		testutil.ProbePath, "serve", "127.0.0.1:8080", "hello-from-the-sandbox")...)
	server.line(t, "listening 127.0.0.1:8080")

	fwd := c.start(t, append(append([]string{"port-forward"}, who...), ":8080")...)
	line := fwd.line(t, "Forwarding from 127.0.0.1:")
	addr := strings.TrimSuffix(strings.TrimPrefix(line, "Forwarding from "), " -> 8080")

	const parallel = 8
	var wg sync.WaitGroup
	errs := make(chan error, parallel)
	for i := range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, err := get(t, fmt.Sprintf("http://%s/conn-%d", addr, i))
			if err == nil && body != fmt.Sprintf("hello-from-the-sandbox /conn-%d", i) {
				err = fmt.Errorf("body %q", body)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("through the forward: %v; port-forward stderr: %s", err, fwd.stderr())
		}
	}

	// Nothing listens on 8081: that connection fails with a coded reason, the forward keeps running.
	bad := c.start(t, append(append([]string{"port-forward"}, who...), ":8081")...)
	badAddr := strings.TrimSuffix(strings.TrimPrefix(bad.line(t, "Forwarding from "), "Forwarding from "), " -> 8081")
	if body, err := get(t, "http://"+badAddr+"/"); err == nil {
		t.Fatalf("a port nothing listens on answered %q", body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(bad.stderr(), "PORT_UNREACHABLE") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(bad.stderr(), "PORT_UNREACHABLE") {
		t.Fatalf("stderr does not say PORT_UNREACHABLE: %s", bad.stderr())
	}
	if body, err := get(t, "http://"+addr+"/again"); err != nil || !strings.HasSuffix(body, "/again") {
		t.Fatalf("the first forward stopped working: %q %v", body, err)
	}

	// The sandbox has no way out: network mode none, and no interface but loopback (read, never dialled).
	ins, err := testutil.Docker(t).ContainerInspect(t.Context(), keyOf(t, tenant, "u").ContainerName(), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if mode := string(ins.Container.HostConfig.NetworkMode); mode != "none" {
		t.Fatalf("network mode %q, want none", mode)
	}
	if err := server.cmd.Process.Signal(syscall.SIGTERM); err != nil { // releases the user's gate
		t.Fatal(err)
	}
	server.wait(t, time.Minute)
	r := c.run(t, append(append([]string{"exec"}, who...), "--", "sh", "-c",
		`tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; echo routes=$(tail -n +2 /proc/net/route | wc -l)`)...).want(t, 0)
	if got := strings.Fields(r.stdout); strings.Join(got, " ") != "lo routes=0" {
		t.Fatalf("interfaces and routes in the sandbox: %q", r.stdout)
	}

	evs := c.run(t, "events", "--json").want(t, 0).stdout
	if n := strings.Count(evs, `"port_forward_opened"`); n < parallel+1 {
		t.Fatalf("%d port_forward_opened events, want at least %d:\n%s", n, parallel+1, evs)
	}
	if n := strings.Count(evs, `"port_forward_closed"`); n < parallel+1 {
		t.Fatalf("%d port_forward_closed events, want at least %d:\n%s", n, parallel+1, evs)
	}
	// Through the daemon, which serves the sandbox's channel, every connection is a stream on it; in-process,
	// the exec that runs the server serves the channel, so port-forward falls back to one engine exec each.
	want := `"transport":"exec"`
	if os.Getenv("SANDKEEP_TEST_DAEMON") != "" {
		want = `"transport":"agent"`
	}
	if n := strings.Count(evs, want); n < parallel+1 {
		t.Fatalf("%d forwards with %s, want at least %d:\n%s", n, want, parallel+1, evs)
	}

	// The sandbox stops: every forward to it ends, with a note, exit 0.
	c.run(t, append([]string{"stop"}, who...)...).want(t, 0)
	if code := fwd.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("port-forward exit %d after the sandbox stopped; stderr: %s", code, fwd.stderr())
	}
	if !strings.Contains(fwd.stderr(), "stopped; port-forward ends") {
		t.Fatalf("port-forward did not say why it ended: %s", fwd.stderr())
	}
}

// TestPortForwardRefusals: bad arguments and a missing sandbox are refused with a code before anything listens.
func TestPortForwardRefusals(t *testing.T) {
	c := newCLI(t)
	for _, args := range [][]string{{"0"}, {"70000"}, {"a:80"}, {"80", "81"}, {"--address", "localhost", "80"}} {
		c.run(t, append([]string{"port-forward", "--user", "u"}, args...)...).wantFailure(t, "INVALID_ARGUMENT")
	}
	c.run(t, "port-forward", "--tenant", c.ten("none"), "--user", "u", "8080").wantFailure(t, "SANDBOX_NOT_FOUND")
}
