package devcontainer

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// ForwardPort is one forwardPorts entry read as the devcontainers CLI and VS Code read it: a bare port (a
// number, or a string of digits) is that port on the container's own loopback; "HOST:PORT" is PORT on HOST as
// the container resolves it: "localhost" and "127.0.0.1" are its loopback again, anything else another host
// (most often a compose service, "db:5432").
type ForwardPort struct {
	Entry string // as the file writes it
	Host  string // "" for a bare port; else the host part, lower-cased, without IPv6 brackets
	Port  int    // 1..65535
}

// Loopback says whether the entry names a port on the container's own loopback (IPv4: the forward connects to
// 127.0.0.1 inside it).
func (f ForwardPort) Loopback() bool {
	return f.Host == "" || f.Host == "localhost" || f.Host == "127.0.0.1"
}

// ParseForwardPort reads one recorded forwardPorts entry (Config.ForwardPorts). An entry that is not a port, or
// not HOST:PORT with a port in 1..65535 and a host name or address, is an error saying so.
func ParseForwardPort(entry string) (ForwardPort, error) {
	fp := ForwardPort{Entry: entry}
	host, port, two := entry, entry, false
	if strings.Contains(entry, ":") {
		h, p, err := net.SplitHostPort(entry)
		if err != nil {
			return fp, fmt.Errorf("%q is neither a port nor HOST:PORT", entry)
		}
		host, port, two = h, p, true
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || port != strconv.Itoa(n) {
		return fp, fmt.Errorf("%q does not name a port between 1 and 65535", entry)
	}
	fp.Port = n
	if !two {
		return fp, nil
	}
	if !hostName(host) || strings.HasPrefix(entry, "[") != strings.Contains(host, ":") { // brackets exactly around IPv6
		return fp, fmt.Errorf("%q does not name a host before its port", entry)
	}
	fp.Host = strings.ToLower(host)
	return fp, nil
}

// hostName is a DNS name (letters, digits, '-', '_', '.') or an IP address, at most 253 bytes.
func hostName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	if net.ParseIP(h) != nil {
		return true
	}
	for _, r := range h {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
		default:
			return false
		}
	}
	return true
}
