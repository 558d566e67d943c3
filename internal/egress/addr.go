package egress

import (
	"net/netip"
)

// Address classes: why the proxy refuses to dial an address unless a rule names it (an IP or CIDR rule; a name
// rule such as "**" never does). Each is also the Reason of the Block and the X-Sandkeep-Denied header.
const (
	ClassUnspecified = "unspecified"  // 0.0.0.0/8, ::
	ClassLoopback    = "loopback"     // 127.0.0.0/8, ::1
	ClassPrivate     = "private"      // RFC 1918, ULA fc00::/7, site-local fec0::/10, local-use NAT64 64:ff9b:1::/48
	ClassCGNAT       = "shared"       // 100.64.0.0/10, carrier-grade NAT (RFC 6598)
	ClassLinkLocal   = "link-local"   // 169.254.0.0/16, fe80::/10
	ClassMetadata    = "metadata"     // the cloud metadata service: 169.254.169.254, fd00:ec2::254
	ClassMulticast   = "multicast"    // 224.0.0.0/4, ff00::/8
	ClassReserved    = "reserved"     // 240.0.0.0/4 (with the broadcast address), IPv4-compatible ::/96
	ClassSelf        = "self"         // one of the proxy's own addresses (Config.Self)
	ClassInvalid     = "invalid-addr" // not an address at all
	// Ranges that are not private but are no public host either: a network behind the host may use them.
	ClassDocumentation = "documentation" // 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32 (RFC 5737, 3849)
	ClassBenchmarking  = "benchmarking"  // 198.18.0.0/15, 2001:2::/48 (RFC 2544, 5180)
	ClassProtocol      = "protocol"      // 192.0.0.0/24 IETF protocol assignments, 100::/64 discard, 2001:10::/28 and 2001:20::/28 ORCHID
	ClassOperator      = "operator"      // a range the operator refuses (Config.Refused): its own public NAT address, ...
)

// classRange is one refused range. The tables are searched in order, so a narrower range (the metadata
// address) comes before the range that contains it (link-local, ULA).
type classRange struct {
	prefix netip.Prefix
	class  string
}

var (
	refused4 = []classRange{
		{netip.MustParsePrefix("169.254.169.254/32"), ClassMetadata},
		{netip.MustParsePrefix("168.63.129.16/32"), ClassMetadata},   // Azure's host endpoint (wireserver)
		{netip.MustParsePrefix("100.100.100.200/32"), ClassMetadata}, // Alibaba Cloud's metadata service
		{netip.MustParsePrefix("192.0.0.0/24"), ClassProtocol},       // includes Oracle Cloud's 192.0.0.192
		{netip.MustParsePrefix("192.0.2.0/24"), ClassDocumentation},
		{netip.MustParsePrefix("198.51.100.0/24"), ClassDocumentation},
		{netip.MustParsePrefix("203.0.113.0/24"), ClassDocumentation},
		{netip.MustParsePrefix("198.18.0.0/15"), ClassBenchmarking},
		{netip.MustParsePrefix("0.0.0.0/8"), ClassUnspecified},
		{netip.MustParsePrefix("127.0.0.0/8"), ClassLoopback},
		{netip.MustParsePrefix("10.0.0.0/8"), ClassPrivate},
		{netip.MustParsePrefix("172.16.0.0/12"), ClassPrivate},
		{netip.MustParsePrefix("192.168.0.0/16"), ClassPrivate},
		{netip.MustParsePrefix("100.64.0.0/10"), ClassCGNAT},
		{netip.MustParsePrefix("169.254.0.0/16"), ClassLinkLocal},
		{netip.MustParsePrefix("224.0.0.0/4"), ClassMulticast},
		{netip.MustParsePrefix("240.0.0.0/4"), ClassReserved},
	}
	refused6 = []classRange{
		{netip.MustParsePrefix("fd00:ec2::254/128"), ClassMetadata},
		{netip.MustParsePrefix("2001:db8::/32"), ClassDocumentation},
		{netip.MustParsePrefix("2001:2::/48"), ClassBenchmarking},
		{netip.MustParsePrefix("100::/64"), ClassProtocol},
		{netip.MustParsePrefix("2001:10::/28"), ClassProtocol},
		{netip.MustParsePrefix("2001:20::/28"), ClassProtocol},
		{netip.MustParsePrefix("::/128"), ClassUnspecified},
		{netip.MustParsePrefix("::1/128"), ClassLoopback},
		{netip.MustParsePrefix("fc00::/7"), ClassPrivate},
		{netip.MustParsePrefix("fec0::/10"), ClassPrivate},
		{netip.MustParsePrefix("64:ff9b:1::/48"), ClassPrivate},
		{netip.MustParsePrefix("fe80::/10"), ClassLinkLocal},
		{netip.MustParsePrefix("ff00::/8"), ClassMulticast},
	}

	// IPv6 ranges whose addresses carry an IPv4 address, and where it sits.
	nat64      = netip.MustParsePrefix("64:ff9b::/96")    // RFC 6052: the last 32 bits
	translated = netip.MustParsePrefix("::ffff:0:0:0/96") // RFC 2765 IPv4-translated: the last 32 bits
	compatible = netip.MustParsePrefix("::/96")           // deprecated IPv4-compatible: the last 32 bits
	sixToFour  = netip.MustParsePrefix("2002::/16")       // RFC 3056: bits 16..48
	teredo     = netip.MustParsePrefix("2001::/32")       // RFC 4380: server at bits 32..64, client inverted in the last 32
)

// classify returns the class that makes addr refused, or "" for an address the proxy may dial. An
// IPv4-mapped address is its IPv4 address; an IPv6 address that embeds an IPv4 address (NAT64, 6to4, Teredo,
// IPv4-translated or -compatible) takes the class of the embedded address, so ::ffff:169.254.169.254 and
// 64:ff9b::a9fe:a9fe are both the metadata address. self lists the proxy's own addresses, extra the ranges the
// operator refuses too.
func classify(addr netip.Addr, self []netip.Addr, extra ...netip.Prefix) string {
	addr = addr.Unmap().WithZone("")
	if !addr.IsValid() {
		return ClassInvalid
	}
	for _, s := range self {
		if s.Unmap().WithZone("") == addr {
			return ClassSelf
		}
	}
	for _, p := range extra {
		if p.Contains(addr) {
			return ClassOperator
		}
	}
	table := refused6
	if addr.Is4() {
		table = refused4
	}
	for _, r := range table {
		if r.prefix.Contains(addr) {
			return r.class
		}
	}
	if addr.Is4() {
		return ""
	}
	for _, v4 := range embeddedIPv4(addr) {
		if c := classify(v4, self, extra...); c != "" {
			return c
		}
	}
	if compatible.Contains(addr) {
		return ClassReserved // not routed anywhere; the embedded address was checked above
	}
	return ""
}

// embeddedIPv4 returns the IPv4 addresses an IPv6 address carries, if it is of a form that carries any.
func embeddedIPv4(a netip.Addr) []netip.Addr {
	b := a.As16()
	last := netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	switch {
	case nat64.Contains(a), translated.Contains(a), compatible.Contains(a):
		return []netip.Addr{last}
	case sixToFour.Contains(a):
		return []netip.Addr{netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})}
	case teredo.Contains(a):
		server := netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]})
		client := netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]})
		return []netip.Addr{server, client}
	}
	return nil
}

// AddrClass returns the class that makes addr refused (loopback, private, metadata, ..., ClassOperator for one of
// refused), or "" for an address the proxy would dial. It is the proxy's own check, for the host's other
// fetches on a repository's behalf (devcontainer features) that must not reach what a sandbox may not.
func AddrClass(addr netip.Addr, refused ...netip.Prefix) string {
	return classify(addr, nil, refused...)
}
