package agentproto

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
)

// FuzzForwardPayloads: the forward frames' payload parsers never panic; an open that decodes re-encodes to the
// same bytes, and the target check passes only loopback addresses; a credit is within 1..ForwardWindow; a reply
// is connected, refused, unreachable or a protocol error, nothing else.
func FuzzForwardPayloads(f *testing.F) {
	f.Add(EncodeForwardOpen(netip.MustParseAddrPort("127.0.0.1:8080")))
	f.Add(EncodeForwardOpen(netip.MustParseAddrPort("[::1]:443")))
	f.Add(EncodeForwardOpen(netip.MustParseAddrPort("192.0.2.1:80")))
	f.Add(EncodeCredit(ForwardWindow))
	f.Add(EncodeForwardReply(ForwardUnreachable, "connect: connection refused"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		if target, err := DecodeForwardOpen(p); err == nil {
			if !target.Addr().Is4In6() && !bytes.Equal(EncodeForwardOpen(target), p) {
				t.Fatalf("open %x decodes to %v, which encodes to %x", p, target, EncodeForwardOpen(target))
			}
			if CheckForwardTarget(target) == nil && !target.Addr().Unmap().IsLoopback() {
				t.Fatalf("target %v passes the loopback check", target)
			}
		} else if !errors.Is(err, ErrProtocol) {
			t.Fatalf("open: %v does not wrap ErrProtocol", err)
		}
		if n, err := DecodeCredit(p); err == nil && (n < 1 || n > ForwardWindow) {
			t.Fatalf("credit %d accepted", n)
		}
		if err := DecodeForwardReply(p); err != nil && !errors.Is(err, ErrProtocol) &&
			!errors.Is(err, ErrForwardRefused) && !errors.Is(err, ErrForwardUnreachable) {
			t.Fatalf("reply: %v", err)
		}
	})
}

// TestForwardTargets: only loopback addresses, IPv4 or IPv6, with a port.
func TestForwardTargets(t *testing.T) {
	for _, tc := range []struct {
		target string
		ok     bool
	}{
		{"127.0.0.1:80", true}, {"127.1.2.3:80", true}, {"[::1]:80", true}, {"[::ffff:127.0.0.1]:80", true},
		{"0.0.0.0:80", false}, {"[::]:80", false}, {"192.0.2.1:80", false}, {"[2001:db8::1]:80", false},
		{"[fe80::1%eth0]:80", false}, {"127.0.0.1:0", false},
	} {
		err := CheckForwardTarget(netip.MustParseAddrPort(tc.target))
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok %v", tc.target, err, tc.ok)
		}
	}
}
