package main

import (
	"errors"
	"log"
	"net"
	"os"
	"path/filepath"
	"strconv"
)

// Host services (an operator's MCP server, an ask-the-user service) reach a sandbox the way its egress proxy
// does: the sandbox keeps no network, and init listens on a loopback address inside it (one per --service) and
// hands each connection to the host over the socket svc-PORT.sock in the channel directory, which the host
// serves (internal/lifecycle/services.go): it checks the run's bearer token there, before anything reaches the
// operator's endpoint. Init adds and reads nothing: the same splice as egress, socket handoff included.
const maxServices = 16 // lifecycle.MaxHostServices names the same bound

// serviceSocketName is the host's socket of the service init forwards from port (lifecycle names the same).
func serviceSocketName(port int) string { return "svc-" + strconv.Itoa(port) + ".sock" }

// startServices listens on each address and forwards it to its socket next to channel. A failure to listen is
// logged and not fatal: commands then cannot reach that service.
func startServices(addrs []string, channel string) {
	logger := log.New(os.Stderr, "sandkeep-agent init: ", 0)
	for _, addr := range addrs {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			logger.Printf("host service forwarder: %v (commands in this sandbox cannot reach it)", err)
			continue
		}
		port := ln.Addr().(*net.TCPAddr).Port
		sock := filepath.Join(filepath.Dir(channel), serviceSocketName(port))
		go forwardEgress(ln, func() (net.Conn, error) { return net.DialTimeout("unix", sock, egressDialTimeout) })
	}
}

// checkServiceAddr checks a --service: a loopback IP and a port other than 0.
func checkServiceAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	ip := net.ParseIP(host)
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || ip == nil || !ip.IsLoopback() {
		return errors.New("--service must be a loopback address and port, e.g. 127.0.0.1:3130")
	}
	return nil
}
