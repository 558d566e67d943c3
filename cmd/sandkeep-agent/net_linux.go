package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// The channel over the pod network (the kubernetes driver). A pod has no host directory to find a socket in,
// so init dials the sandkeep server's channel address over TCP and opens each connection with a hello: the
// pod's name and a per-pod token. The token reaches the pod through the init container (its environment, which
// the sandbox container never sees), which writes it to a file in a memory volume; init reads that file first
// thing and removes it, so no command can read it afterwards, and init itself is not dumpable (its memory and
// environment are closed to commands of the same uid). A command that dials the server does not know the
// token and is refused. The rest is the Unix channel's loop (channel_linux.go): one serve child per
// connection, a sweep of the namespace after a session that ended badly, redial with backoff.
const (
	// tokenEnv is the init container's environment variable holding the token `install --token-file` writes.
	tokenEnv = "SANDKEEP_CHANNEL_TOKEN"
	// defaultTokenFile is where the kubernetes driver has the token written (its memory volume); serve removes
	// it too, so that a command that reaches the pod before init read it still finds nothing.
	defaultTokenFile = "/.sandkeep-token/token"
	// netDialTimeout bounds one connect and the hello's write; init reaps nothing meanwhile.
	netDialTimeout = 2 * time.Second
	// netKeepAlive probes an idle channel so that a server or node that vanished is noticed.
	netKeepAlive = 15 * time.Second
)

// checkNetChannel validates --net-channel: an IP literal and a port (the pods' NetworkPolicy allows the server
// by address, and the pod needs no DNS to find it).
func checkNetChannel(v string) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("--net-channel %q: %v", v, err)
	}
	if net.ParseIP(host) == nil {
		return fmt.Errorf("--net-channel %q: the host must be an IP address", v)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("--net-channel %q: bad port", v)
	}
	return nil
}

// runNetInit is init with --net-channel: it takes the token, then runs the channel loop over TCP. Without a
// token (the file is missing or bad) it is plain init: commands then go through the API server's exec.
func runNetInit(f initFlags) int {
	logger := log.New(os.Stderr, "sandkeep-agent init: ", 0)
	if os.Getpid() != 1 {
		logger.Printf("--net-channel needs to run as PID 1 (pid is %d)", os.Getpid())
		return 2
	}
	token, err := takeToken(f.tokenFile)
	if err != nil {
		logger.Printf("channel token: %v (no channel; commands go through the API server's exec)", err)
		return runInit("", "", false)
	}
	hello, err := agentproto.AppendHello(nil, agentproto.Hello{Name: f.pod, Token: token})
	var egressHello []byte
	if err == nil && f.egress != "" {
		egressHello, err = agentproto.AppendHello(nil, agentproto.Hello{Name: f.pod, Token: token, Egress: true})
	}
	fw := newFollower(f, token, logger) // keeps the token: announcements are checked against it (follow_linux.go)
	clear(token)
	if err != nil {
		logger.Printf("channel hello: %v (no channel)", err)
		return runInit("", "", false)
	}
	fixTmp()
	if f.egress != "" {
		startNetEgress(f.egress, fw.current, egressHello, logger)
	}
	return runChannelFollowing(func() (*os.File, error) {
		fw.check()
		return dialNet(fw.current(), hello)
	}, fw.check, nil)
}

// takeToken reads the token file (never following a link) and removes it, whatever the read gave.
func takeToken(path string) ([]byte, error) {
	defer os.Remove(path)
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, agentproto.MaxHelloToken+2))
	if err != nil {
		return nil, err
	}
	b = bytes.TrimSpace(b)
	if len(b) < agentproto.MinHelloToken || len(b) > agentproto.MaxHelloToken {
		return nil, fmt.Errorf("%s: a token of %d bytes", path, len(b))
	}
	return b, nil
}

// consumeToken removes the default token file if it is still there (serve, started through the API server's
// exec before init got to it: the channel then stays down, and no command ever reads the token).
func consumeToken() {
	if err := os.Remove(defaultTokenFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		// A read-only or absent directory (a Docker sandbox) is nothing to report.
		return
	}
}

// dialNet connects to addr, writes the hello and returns the connection as a blocking file for the serve child.
func dialNet(addr string, hello []byte) (*os.File, error) {
	c, err := net.DialTimeout("tcp", addr, netDialTimeout)
	if err != nil {
		return nil, err
	}
	defer c.Close() // the file below is a duplicate
	tc := c.(*net.TCPConn)
	_ = tc.SetKeepAlive(true)
	_ = tc.SetKeepAlivePeriod(netKeepAlive)
	_ = tc.SetNoDelay(true)
	if err := tc.SetWriteDeadline(time.Now().Add(netDialTimeout)); err != nil {
		return nil, err
	}
	if _, err := tc.Write(hello); err != nil {
		return nil, err
	}
	if err := tc.SetWriteDeadline(time.Time{}); err != nil {
		return nil, err
	}
	f, err := tc.File()
	if err != nil {
		return nil, err
	}
	f.Fd() // blocking mode: the serve child reads and writes it as plain stdin and stdout
	return f, nil
}
