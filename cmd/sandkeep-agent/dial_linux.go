package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"
)

// DialReady is the line `sandkeep-agent dial` writes on stdout once its connection is up; anything else (EOF,
// with the reason on stderr) means it could not connect. The host reads it before it hands the stream out
// (internal/driver/docker's DialPort names the same line).
const dialReady = "ok\n"

// dialTimeout bounds the connect to the sandbox's own loopback.
const dialTimeout = 5 * time.Second

// dialBuiltin runs `sandkeep-agent dial PORT`: the port-forward's end inside the sandbox. It connects to
// 127.0.0.1:PORT in the sandbox's own network namespace (the sandbox has no other network) and copies stdin
// to the connection and the connection to stdout, until the connection's reading side ends. The host's stream
// reaching EOF half-closes the connection, as a TCP peer's FIN would.
func dialBuiltin(args []string) (int, bool) {
	if len(args) == 0 || args[0] != "dial" {
		return 0, false
	}
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: sandkeep-agent dial PORT")
		return 2, true
	}
	port, err := strconv.Atoi(args[1])
	if err != nil || port < 1 || port > 65535 {
		fmt.Fprintf(os.Stderr, "sandkeep-agent dial: port %q is not in 1..65535\n", args[1])
		return 2, true
	}
	return dial(port, os.Stdin, os.Stdout), true
}

func dial(port int, in io.Reader, out io.Writer) int {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dialTimeout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandkeep-agent dial: %v\n", err)
		return 1
	}
	defer c.Close()
	if _, err := io.WriteString(out, dialReady); err != nil {
		return 1
	}
	// The host's bytes: at their end, half-close, so the server sees the client's FIN. This goroutine ends with
	// the process (it may sit in a Read of stdin, which cannot be interrupted).
	go func() {
		_, _ = io.Copy(c, in)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	_, _ = io.Copy(out, c) // the server's bytes, until it closes
	// The server is done: nothing more can be answered, so the host's side is not waited for.
	return 0
}
