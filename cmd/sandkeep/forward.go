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
	"syscall"
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

With no port, the repository's devcontainer.json "forwardPorts" are forwarded, each on the same local port
(as the devcontainers CLI and VS Code do): a bare port, "localhost:PORT" and "127.0.0.1:PORT" are the sandbox's
loopback; "SERVICE:PORT" is forwarded when SERVICE is the compose service the sandbox is or one of its
companions (runServices), which listen on the sandbox's loopback. Any other entry is not forwarded, with one
line saying why; none to forward is a usage error. A local port already in use is LOCAL_PORT_IN_USE, and
nothing is forwarded: forward that one as LOCAL:PORT instead.

sandkeep prints "Forwarding from ADDR -> PORT" (one line per port) once it listens and runs until
interrupted (exit 130), or until the sandbox stops (exit 0, with a note). The sandbox must be running: a command starts it. Each
connection is recorded as port_forward_opened and port_forward_closed events.`

func newPortForward(g *globals) *cobra.Command {
	var (
		w       who
		address string
		spec    string
	)
	cmd := &cobra.Command{
		Use:   "port-forward --user U [--tenant T] [--address IP] [--spec FILE] [[LOCAL:]PORT]",
		Short: "Forward a local port (or devcontainer.json's forwardPorts) to the user's sandbox",
		Long:  forwardLong,
		Example: `  sandkeep exec --user alice -- sh -c 'nohup python3 -m http.server 8000 >/dev/null 2>&1 &'
  sandkeep port-forward --user alice 8000            # http://127.0.0.1:8000 reaches it
  sandkeep port-forward --user alice 9000:8000
  sandkeep port-forward --user alice :8000           # a free local port, printed
  sandkeep port-forward --user alice                 # devcontainer.json's forwardPorts, each on its own port`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := w.key(cmd)
			if err != nil {
				return err
			}
			if len(args) > 1 {
				return fault.New(fault.InvalidArgument, "pass one port, e.g. 8080 or 9000:8080, or none for devcontainer.json's forwardPorts",
					"port-forward takes one [LOCAL:]PORT, got %d arguments", len(args))
			}
			var one *forward
			if len(args) == 1 {
				local, remote, err := parseForward(args[0])
				if err != nil {
					return err
				}
				one = &forward{local: local, port: remote}
			}
			ip, err := netip.ParseAddr(address)
			if err != nil {
				return fault.New(fault.InvalidArgument, "use an IP address, e.g. --address 127.0.0.1",
					"--address %q is not an IP address", address)
			}
			return runForward(cmd.Context(), g, key, ip, one, spec)
		},
	}
	w.bind(cmd)
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "the local IP address to listen on")
	cmd.Flags().StringVar(&spec, "spec", "", "with no port: the project's sandkeep.yaml whose devcontainer.json's forwardPorts are forwarded (default: the sandbox's template's, else $SANDKEEP_SPEC)")
	return cmd
}

// forward is one local port carried to a port inside the sandbox.
type forward struct {
	local, port int    // local 0: a free one
	entry       string // the forwardPorts entry it comes from; "" for the argument
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

// repositoryForwards are the forwards devcontainer.json's forwardPorts give, each on its own local port; what
// is not forwarded is one line each on stderr. None to forward is a usage error.
func repositoryForwards(ctx context.Context, g *globals, m *sandkeep.Manager, key sandkeep.Key, spec string) ([]forward, error) {
	fps, err := m.ForwardPorts(ctx, key, spec)
	if err != nil {
		return nil, err
	}
	if len(fps) == 0 {
		return nil, fault.New(fault.InvalidArgument,
			`pass the port to forward, e.g. sandkeep port-forward --user U 8080 (or LOCAL:PORT), or list it in devcontainer.json's "forwardPorts"`,
			"no port given, and the repository's devcontainer.json has no forwardPorts to forward")
	}
	var out []forward
	for _, fp := range fps {
		if !fp.Forwarded {
			fmt.Fprintf(g.stderr, "sandkeep: forwardPorts %s\n", fp)
			continue
		}
		out = append(out, forward{local: fp.Port, port: fp.Port, entry: fp.Entry})
	}
	if len(out) == 0 {
		return nil, fault.New(fault.InvalidArgument,
			`pass the port to forward (PORT or LOCAL:PORT), or write devcontainer.json's forwardPorts as ports on the sandbox's loopback (3000, "localhost:3000") or on its compose companions ("db:5432")`,
			"none of the repository's %d forwardPorts can be forwarded (the lines above say why)", len(fps))
	}
	return out, nil
}

// listenAll listens on every forward's local port, or on none: a port that cannot be had closes the ones
// already open, and its error says which.
func listenAll(ctx context.Context, ip netip.Addr, fws []forward) ([]net.Listener, error) {
	lns := make([]net.Listener, 0, len(fws))
	for _, f := range fws {
		addr := netip.AddrPortFrom(ip, uint16(f.local))
		ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr.String())
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, listenError(addr, f, err)
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

func listenError(addr netip.AddrPort, f forward, err error) error {
	what := ""
	if f.entry != "" {
		what = fmt.Sprintf(" (devcontainer.json's forwardPorts %q)", f.entry)
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		return fault.Wrap(err, fault.LocalPortInUse,
			fmt.Sprintf("forward it on another local port with LOCAL:PORT, e.g. sandkeep port-forward --user U %d:%d, or :%d for a free one", 10000+f.port%55536, f.port, f.port),
			"local port %s is already in use%s; nothing is forwarded", addr, what)
	}
	return fault.Wrap(err, fault.InvalidArgument, "pick another local port, or :PORT for a free one",
		"cannot listen on %s%s: %v; nothing is forwarded", addr, what, err)
}

func runForward(ctx context.Context, g *globals, key sandkeep.Key, ip netip.Addr, one *forward, spec string) error {
	m, closeAll, err := g.manager(ctx, nil)
	if err != nil {
		return err
	}
	defer closeAll()
	var fws []forward
	if one != nil {
		fws = []forward{*one}
	} else if fws, err = repositoryForwards(ctx, g, m, key, spec); err != nil {
		return err
	}
	if err := running(ctx, m, key); err != nil {
		return err
	}
	lns, err := listenAll(ctx, ip, fws)
	if err != nil {
		return err
	}
	for i, ln := range lns {
		fmt.Fprintf(g.stdout, "Forwarding from %s -> %d\n", ln.Addr(), fws[i].port)
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup // the accept loops, the watcher and every connection's handler
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
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for i, ln := range lns {
		port := fws[i].port
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cancel(nil) // a listener that fails ends them all
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					forwardOne(ctx, g, m, key, port, c)
				}()
			}
		}()
	}
	<-ctx.Done()
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
