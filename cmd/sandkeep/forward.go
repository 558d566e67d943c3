package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
)

const forwardLong = `Forward a local TCP port to a port a command listens on inside the user's sandbox, like kubectl
port-forward. The sandbox keeps its network as it is (mode none: nothing inside can connect out): each
connection to the local port is carried into the sandbox by its agent, which connects to 127.0.0.1:PORT
from inside the sandbox's own network namespace. Connections run in parallel and never wait for the user's
commands.

[LOCAL:]PORT: the sandbox's PORT, on the same local port, or on LOCAL (0, or an empty LOCAL as in :8080,
picks a free one). The local listener is on 127.0.0.1 unless --address says otherwise; another address
exposes the sandbox's port to whoever can reach it.

sandkeep prints "Forwarding from ADDR -> PORT" once it listens and runs until interrupted (exit 130), or
until the sandbox stops (exit 0, with a note). The sandbox must be running: a command starts it. Each
connection is recorded as port_forward_opened and port_forward_closed events.`

func newPortForward(g *globals) *cobra.Command {
	var (
		w       who
		address string
	)
	cmd := &cobra.Command{
		Use:   "port-forward --user U [--tenant T] [--address IP] [LOCAL:]PORT",
		Short: "Forward a local port to a port inside the user's sandbox",
		Long:  forwardLong,
		Example: `  sandkeep exec --user alice -- sh -c 'nohup python3 -m http.server 8000 >/dev/null 2>&1 &'
  sandkeep port-forward --user alice 8000            # http://127.0.0.1:8000 reaches it
  sandkeep port-forward --user alice 9000:8000
  sandkeep port-forward --user alice :8000           # a free local port, printed`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := w.key(cmd)
			if err != nil {
				return err
			}
			if len(args) != 1 {
				return fault.New(fault.InvalidArgument, "pass one port, e.g. 8080 or 9000:8080",
					"port-forward takes one [LOCAL:]PORT, got %d arguments", len(args))
			}
			local, remote, err := parseForward(args[0])
			if err != nil {
				return err
			}
			ip, err := netip.ParseAddr(address)
			if err != nil {
				return fault.New(fault.InvalidArgument, "use an IP address, e.g. --address 127.0.0.1",
					"--address %q is not an IP address", address)
			}
			return runForward(cmd.Context(), g, key, netip.AddrPortFrom(ip, uint16(local)), remote)
		},
	}
	w.bind(cmd)
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "the local IP address to listen on")
	return cmd
}

// parseForward reads [LOCAL:]PORT.
func parseForward(s string) (local, remote int, err error) {
	l, r, two := strings.Cut(s, ":")
	if !two {
		l, r = s, s
	}
	bad := func() (int, int, error) {
		return 0, 0, fault.New(fault.InvalidArgument, "use PORT or LOCAL:PORT with ports in 1..65535 (LOCAL may be 0 or empty: a free one)",
			"%q is not a port to forward", s)
	}
	if remote, err = strconv.Atoi(r); err != nil || remote < 1 || remote > 65535 {
		return bad()
	}
	if l == "" {
		return 0, remote, nil
	}
	if local, err = strconv.Atoi(l); err != nil || local < 0 || local > 65535 {
		return bad()
	}
	return local, remote, nil
}

// forwardPoll is how often port-forward checks that the sandbox still runs.
const forwardPoll = time.Second

func runForward(ctx context.Context, g *globals, key sandkeep.Key, addr netip.AddrPort, port int) error {
	m, closeAll, err := g.manager(ctx, nil)
	if err != nil {
		return err
	}
	defer closeAll()
	if err := running(ctx, m, key); err != nil {
		return err
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr.String())
	if err != nil {
		return fault.Wrap(err, fault.InvalidArgument, "pick another local port, or :PORT for a free one",
			"cannot listen on %s: %v", addr, err)
	}
	fmt.Fprintf(g.stdout, "Forwarding from %s -> %d\n", ln.Addr(), port)

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup // the accept loop, the watcher and every connection's handler
	defer wg.Wait()
	stopped := errors.New("sandbox stopped")
	wg.Add(1)
	go func() { // the sandbox stopping ends the forward, as a pod's end ends kubectl's
		defer wg.Done()
		t := time.NewTicker(forwardPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := running(ctx, m, key); err != nil && ctx.Err() == nil {
					cancel(stopped)
					return
				}
			}
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			forwardOne(ctx, g, m, key, port, c)
		}()
	}
	cancel(nil)
	if errors.Is(context.Cause(ctx), stopped) {
		fmt.Fprintf(g.stderr, "sandkeep: sandbox %s stopped; port-forward ends\n", key.ContainerName())
		return nil
	}
	return ctx.Err() // an interruption: run() reports it
}

// running is nil when key's sandbox runs.
func running(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key) error {
	sb, err := m.Sandbox(ctx, key)
	if err != nil {
		return err
	}
	if sb.State != "running" {
		return fault.New(fault.SandboxNotRunning, "run a command in it first (sandkeep exec), which starts it",
			"sandbox %s is %s; a port can be forwarded only to a running sandbox", sb.Name, sb.State)
	}
	return nil
}

// forwardOne carries one local connection into the sandbox until both directions end or ctx does. A failure
// to reach the port is reported on stderr and closes this connection only, as kubectl does.
func forwardOne(ctx context.Context, g *globals, m *sandkeep.Manager, key sandkeep.Key, port int, c net.Conn) {
	defer c.Close()
	r, err := m.DialPort(ctx, key, port, sandkeep.PortForward{Via: "cli"})
	if err != nil {
		if ctx.Err() == nil {
			printError(g.stderr, err)
		}
		return
	}
	defer r.Close()
	stop := context.AfterFunc(ctx, func() { c.Close(); r.Close() })
	defer stop()
	splice(c, r)
}

// splice copies between the local connection and the sandbox's. The local side's end half-closes the sandbox's
// (the server sees the client's FIN and may still answer); the sandbox side's end closes both, since nothing
// more can be answered, as the agent's own end does.
func splice(local, sandbox net.Conn) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(sandbox, local)
		closeWrite(sandbox)
	}()
	_, _ = io.Copy(local, sandbox)
	local.Close()
	sandbox.Close()
	wg.Wait()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}
