package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// labelGen is one DNS label as a person may write it: mixed case, or non-ASCII (converted to punycode). A label
// with "--" in its third and fourth characters is reserved by IDNA for A-labels (xn--...), and NormalizeHost
// rightly refuses a made-up one, so the generator does not draw those.
func labelGen() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.StringMatching(`[a-zA-Z0-9]([a-zA-Z0-9-]{0,8}[a-zA-Z0-9])?`).Filter(func(l string) bool {
			return len(l) < 4 || l[2:4] != "--"
		}),
		rapid.SampledFrom([]string{"bücher", "straße", "пример", "例え", "ÄÖÜ", "xn--bcher-kva", "0x7g", "123"}),
	)
}

// nameGen is a DNS name whose last label is not numeric (so it stays a name), optionally with a trailing dot.
func nameGen() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		labels := rapid.SliceOfN(labelGen(), 0, 3).Draw(t, "labels")
		tld := rapid.StringMatching(`[a-zA-Z]{2,6}`).Draw(t, "tld")
		name := strings.Join(append(labels, tld), ".")
		if rapid.Bool().Draw(t, "dot") {
			name += "."
		}
		return name
	})
}

// ipv4Spelling writes v in one of the spellings inet_aton accepts.
func ipv4Spelling(t *rapid.T, v uint32) string {
	b := [4]uint32{v >> 24, v >> 16 & 0xff, v >> 8 & 0xff, v & 0xff}
	part := func(n uint32) string {
		switch rapid.IntRange(0, 2).Draw(t, "base") {
		case 1:
			return "0x" + strconv.FormatUint(uint64(n), 16)
		case 2:
			return "0" + strconv.FormatUint(uint64(n), 8)
		}
		return strconv.FormatUint(uint64(n), 10)
	}
	switch rapid.IntRange(0, 4).Draw(t, "form") {
	case 1: // a.b.c16
		return part(b[0]) + "." + part(b[1]) + "." + part(v&0xffff)
	case 2: // a.b24
		return part(b[0]) + "." + part(v&0xffffff)
	case 3: // one 32-bit number
		return part(v)
	case 4: // IPv4-mapped IPv6
		return "[::ffff:" + netip.AddrFrom4([4]byte{byte(b[0]), byte(b[1]), byte(b[2]), byte(b[3])}).String() + "]"
	}
	return part(b[0]) + "." + part(b[1]) + "." + part(b[2]) + "." + part(b[3])
}

func addr4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// hostGen is any host a client may send: a name, an IPv4 spelling, an IPv6 literal, with or without a port.
func hostGen() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		var h string
		switch rapid.IntRange(0, 2).Draw(t, "kind") {
		case 0:
			h = nameGen().Draw(t, "name")
		case 1:
			h = ipv4Spelling(t, rapid.Uint32().Draw(t, "v4"))
		case 2:
			b := rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "v6")
			h = "[" + netip.AddrFrom16([16]byte(b)).String() + "]"
		}
		if rapid.Bool().Draw(t, "port") {
			h += ":" + strconv.Itoa(rapid.IntRange(1, 65535).Draw(t, "portnum"))
		}
		return h
	})
}

// ruleGen is a valid rule in any spelling.
func ruleGen() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		var host string
		v6 := false
		switch rapid.IntRange(0, 6).Draw(t, "kind") {
		case 0:
			host = nameGen().Draw(t, "name")
		case 1:
			host = "*." + nameGen().Draw(t, "name")
		case 2:
			host = "**." + nameGen().Draw(t, "name")
		case 3:
			host = "**"
		case 4:
			host = ipv4Spelling(t, rapid.Uint32().Draw(t, "v4"))
			v6 = strings.HasPrefix(host, "[")
			host = strings.Trim(host, "[]")
		case 5:
			bits := rapid.IntRange(0, 32).Draw(t, "bits")
			host = netip.PrefixFrom(addr4(rapid.Uint32().Draw(t, "v4")), bits).Masked().String()
		case 6:
			b := rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "v6")
			bits := rapid.IntRange(0, 128).Draw(t, "bits")
			host = netip.PrefixFrom(netip.AddrFrom16([16]byte(b)), bits).Masked().String()
			if rapid.Bool().Draw(t, "addr") {
				host = netip.AddrFrom16([16]byte(b)).String()
			}
			v6 = true
		}
		if rapid.Bool().Draw(t, "port") {
			if v6 {
				host = "[" + host + "]"
			}
			host += ":" + strconv.Itoa(rapid.IntRange(1, 65535).Draw(t, "portnum"))
		}
		if rapid.Bool().Draw(t, "negate") {
			host = "!" + host
		}
		return host
	})
}

// TestNormalizeHostProperties: NormalizeHost is idempotent, and every IPv4 spelling denotes its address.
func TestNormalizeHostProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := rapid.OneOf(hostGen(), rapid.String(), rapid.StringMatching(`[0-9a-fx.:\[\]]{0,20}`)).Draw(t, "host")
		checkNormalized(t, h)
	})
	rapid.Check(t, func(t *rapid.T) {
		v := rapid.Uint32().Draw(t, "v")
		h := ipv4Spelling(t, v)
		_, ip, isIP, err := NormalizeHost(h)
		if err != nil || !isIP || ip != addr4(v) {
			t.Fatalf("NormalizeHost(%q) = %v, %v, %v; want %v", h, ip, isIP, err, addr4(v))
		}
	})
	rapid.Check(t, func(t *rapid.T) {
		h := nameGen().Draw(t, "name")
		if _, _, isIP, err := NormalizeHost(h); err != nil || isIP {
			t.Fatalf("NormalizeHost(%q) = isIP %v, %v; want a name", h, isIP, err)
		}
	})
}

// checkNormalized fails t unless h either fails with a *RuleError or normalises to a fixed point.
func checkNormalized(t interface{ Fatalf(string, ...any) }, h string) {
	host, ip, isIP, err := NormalizeHost(h)
	if err != nil {
		var re *RuleError
		if !errors.As(err, &re) || !strings.HasPrefix(string(re.Code), "SK3") || re.Message == "" {
			t.Fatalf("NormalizeHost(%q): error %#v is not a coded *RuleError", h, err)
		}
		return
	}
	host2, ip2, isIP2, err := NormalizeHost(host)
	if err != nil || host2 != host || ip2 != ip || isIP2 != isIP {
		t.Fatalf("NormalizeHost(%q) = %q; again = %q, %v, %v, %v: not idempotent", h, host, host2, ip2, isIP2, err)
	}
	if isIP != ip.IsValid() || (isIP && (ip.String() != host || ip.Is4In6() || ip.Zone() != "")) {
		t.Fatalf("NormalizeHost(%q) = %q, %v, %v: ip and host disagree", h, host, ip, isIP)
	}
	if !isIP && (len(host) > maxNameLen || checkName(host) != "" || endsInNumber(host)) {
		t.Fatalf("NormalizeHost(%q) = %q: not a valid DNS name", h, host)
	}
}

// TestRuleRoundTrip: every rule that parses prints to a canonical form that parses to the same rule.
func TestRuleRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := ruleGen().Draw(t, "rule")
		r, err := ParseRule(s)
		if err != nil {
			t.Fatalf("ParseRule(%q): %v", s, err)
		}
		checkRoundTrip(t, s, r)
	})
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.OneOf(rapid.String(), rapid.StringMatching(`!?[*a-z0-9.:/\[\]]{0,16}`)).Draw(t, "rule")
		if r, err := ParseRule(s); err == nil {
			checkRoundTrip(t, s, r)
		}
	})
}

func checkRoundTrip(t interface{ Fatalf(string, ...any) }, s string, r Rule) {
	again, err := ParseRule(r.String())
	if err != nil || again != r || again.String() != r.String() {
		t.Fatalf("ParseRule(%q) = %+v, String %q; ParseRule of that = %+v, %v", s, r, r.String(), again, err)
	}
	kinds := 0
	for _, set := range []bool{r.Prefix.IsValid(), r.IP.IsValid(), r.Host != "" || r.Wildcard == All} {
		if set {
			kinds++
		}
	}
	if kinds != 1 || (r.Wildcard == All && r.Host != "") || (r.Wildcard != Exact && (r.IP.IsValid() || r.Prefix.IsValid())) {
		t.Fatalf("ParseRule(%q) = %+v: not exactly one of prefix, ip, host", s, r)
	}
}

// TestMatchProperties: wildcard depth, spelling invariance, negation, last-match-wins and ports.
func TestMatchProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		name, _, _, err := NormalizeHost(nameGen().Draw(t, "name"))
		if err != nil {
			t.Fatalf("name: %v", err)
		}
		sub := rapid.StringMatching(`[a-z][a-z0-9]{0,5}`).Draw(t, "sub")
		port := uint16(rapid.IntRange(1, 65535).Draw(t, "port"))
		one, two := sub+"."+name, sub+"."+sub+"."+name
		cases := []struct {
			rule               string
			self, oneUp, twoUp bool
		}{
			{name, true, false, false},
			{"*." + name, false, true, false},
			{"**." + name, true, true, true},
			{"**", true, true, true},
		}
		for _, c := range cases {
			rules := mustRulesT(t, c.rule)
			for _, h := range []struct {
				host string
				want bool
			}{{name, c.self}, {one, c.oneUp}, {two, c.twoUp}} {
				// Spelling does not change the outcome: upper case, trailing dot, a port in the host.
				for _, spelled := range []string{h.host, strings.ToUpper(h.host) + ".", h.host + ":1"} {
					if r, ok := Match(rules, spelled, port); ok != h.want || (r != nil) != h.want {
						t.Fatalf("rule %q on %q: matched %v, ok %v; want %v", c.rule, spelled, r, ok, h.want)
					}
				}
			}
			// A negated copy denies; whichever of the two comes last wins.
			if r, ok := Match(mustRulesT(t, c.rule, "!"+c.rule), name, port); ok || (r == nil) == c.self {
				t.Fatalf("rule %q then its negation: %v, %v", c.rule, r, ok)
			}
			if _, ok := Match(mustRulesT(t, "!"+c.rule, c.rule), name, port); ok != c.self {
				t.Fatalf("negation of %q then the rule: ok %v; want %v", c.rule, ok, c.self)
			}
			// A port narrows the rule to that port only.
			withPort := mustRulesT(t, fmt.Sprintf("%s:%d", c.rule, port))
			if _, ok := Match(withPort, name, port); ok != c.self {
				t.Fatalf("rule %s:%d on port %d: %v", c.rule, port, port, ok)
			}
			if _, ok := Match(withPort, name, port%65535+1); ok {
				t.Fatalf("rule %s:%d matched port %d", c.rule, port, port%65535+1)
			}
		}
	})
	rapid.Check(t, func(t *rapid.T) {
		v := rapid.Uint32().Draw(t, "v")
		spelled := ipv4Spelling(t, v)
		bits := rapid.IntRange(0, 32).Draw(t, "bits")
		p := netip.PrefixFrom(addr4(v), bits).Masked()
		for _, rule := range []string{addr4(v).String(), p.String(), "::ffff:" + addr4(v).String(), "**"} {
			if r, ok := Match(mustRulesT(t, rule), spelled, 443); r == nil || !ok {
				t.Fatalf("rule %q does not match %q (%v)", rule, spelled, addr4(v))
			}
		}
		if r, _ := Match(mustRulesT(t, "**.com", "*.com", "localhost"), spelled, 443); r != nil {
			t.Fatalf("name rule %v matched the address %q", r, spelled)
		}
	})
}

func mustRulesT(t *rapid.T, in ...string) []Rule {
	rules, errs := ParseRules(in)
	if errs != nil {
		t.Fatalf("ParseRules(%q): %v", in, errs[0])
	}
	return rules
}
