package egress

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/sandkeep/sandkeep/internal/diag"
)

func TestNormalizeHost(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string // "" with code set: an error
		isIP bool
		code diag.Code
	}{
		{name: "lower case", in: "Example.COM", want: "example.com"},
		{name: "trailing dot", in: "example.com.", want: "example.com"},
		{name: "only one trailing dot", in: "example.com..", code: diag.RuleHost},
		{name: "port", in: "example.com:443", want: "example.com"},
		{name: "trailing dot and port", in: "Example.com.:8080", want: "example.com"},
		{name: "single label", in: "localhost", want: "localhost"},
		{name: "idn", in: "bücher.de", want: "xn--bcher-kva.de"},
		{name: "idn upper case", in: "BÜCHER.DE", want: "xn--bcher-kva.de"},
		{name: "idn ideographic full stop", in: "bücher。de", want: "xn--bcher-kva.de"},
		{name: "punycode kept", in: "xn--bcher-kva.de", want: "xn--bcher-kva.de"},
		{name: "punycode upper case", in: "XN--BCHER-KVA.DE", want: "xn--bcher-kva.de"},
		{name: "sharp s is not ss", in: "straße.de", want: "xn--strae-oqa.de"},
		{name: "digits in a name", in: "1e100.net", want: "1e100.net"},
		{name: "numeric first label", in: "123.example", want: "123.example"},
		{name: "hex-looking name", in: "0x7g.com", want: "0x7g.com"},

		{name: "dotted decimal", in: "127.0.0.1", want: "127.0.0.1", isIP: true},
		{name: "dotted decimal with port", in: "127.0.0.1:80", want: "127.0.0.1", isIP: true},
		{name: "dotted decimal trailing dot", in: "127.0.0.1.", want: "127.0.0.1", isIP: true},
		{name: "shortened two parts", in: "127.1", want: "127.0.0.1", isIP: true},
		{name: "shortened three parts", in: "10.1.256", want: "10.1.1.0", isIP: true},
		{name: "hex part", in: "0x7f.1", want: "127.0.0.1", isIP: true},
		{name: "hex upper case", in: "0X7F.0X0.0X0.0X1", want: "127.0.0.1", isIP: true},
		{name: "hex whole", in: "0x7f000001", want: "127.0.0.1", isIP: true},
		{name: "bare 0x is zero", in: "0x", want: "0.0.0.0", isIP: true},
		{name: "octal parts", in: "0177.0.0.1", want: "127.0.0.1", isIP: true},
		{name: "octal metadata", in: "0251.0376.0251.0376", want: "169.254.169.254", isIP: true},
		{name: "32-bit integer", in: "2130706433", want: "127.0.0.1", isIP: true},
		{name: "32-bit integer max", in: "4294967295", want: "255.255.255.255", isIP: true},
		{name: "metadata integer", in: "2852039166", want: "169.254.169.254", isIP: true},
		{name: "fullwidth digits", in: "１２７.０.０.１", want: "127.0.0.1", isIP: true},
		{name: "ipv6 bracketed", in: "[::1]", want: "::1", isIP: true},
		{name: "ipv6 bracketed with port", in: "[2001:DB8::1]:443", want: "2001:db8::1", isIP: true},
		{name: "ipv6 bare", in: "2001:db8::1", want: "2001:db8::1", isIP: true},
		{name: "ipv4-mapped hex", in: "[::ffff:a9fe:a9fe]", want: "169.254.169.254", isIP: true},
		{name: "ipv4-mapped dotted", in: "[::ffff:127.0.0.1]:80", want: "127.0.0.1", isIP: true},
		{name: "ipv4-mapped bare", in: "::ffff:7f00:1", want: "127.0.0.1", isIP: true},

		{name: "empty", in: "", code: diag.RuleEmpty},
		{name: "dot", in: ".", code: diag.RuleEmpty},
		{name: "port only", in: ":443", code: diag.RuleEmpty},
		{name: "empty label", in: "a..b", code: diag.RuleHost},
		{name: "leading dot", in: ".a.com", code: diag.RuleHost},
		{name: "ends in a number, not an ip", in: "a.1", code: diag.RuleHost},
		{name: "ends in hex, not an ip", in: "example.0x1f", code: diag.RuleHost},
		{name: "five parts", in: "1.2.3.4.5", code: diag.RuleHost},
		{name: "part over 255", in: "256.1.1.1", code: diag.RuleHost},
		{name: "integer over 32 bits", in: "4294967296", code: diag.RuleHost},
		{name: "shortened last part too big", in: "1.2.65536", code: diag.RuleHost},
		{name: "bad octal", in: "08.1.1.1", code: diag.RuleHost},
		{name: "underscore", in: "foo_bar.com", code: diag.RuleHost},
		{name: "wildcard", in: "*.example.com", code: diag.RuleHost},
		{name: "space", in: "example .com", code: diag.RuleHost},
		{name: "percent", in: "exa%6dple.com", code: diag.RuleHost},
		{name: "slash", in: "example.com/x", code: diag.RuleHost},
		{name: "userinfo", in: "user@example.com", code: diag.RuleHost},
		{name: "nul", in: "a\x00.com", code: diag.RuleHost},
		{name: "fullwidth slash", in: "example.com／x", code: diag.RuleHost},
		{name: "leading hyphen", in: "-a.com", code: diag.RuleHost},
		{name: "label too long", in: "a234567890123456789012345678901234567890123456789012345678901234.com", code: diag.RuleHost},
		{name: "bad punycode", in: "xn--zz.com", code: diag.RuleHost},
		{name: "bad port", in: "example.com:http", code: diag.RulePort},
		{name: "port zero", in: "example.com:0", code: diag.RulePort},
		{name: "port too big", in: "example.com:65536", code: diag.RulePort},
		{name: "empty port", in: "example.com:", code: diag.RulePort},
		{name: "unclosed bracket", in: "[::1", code: diag.RuleHost},
		{name: "junk after bracket", in: "[::1]x", code: diag.RuleHost},
		{name: "ipv4 in brackets", in: "[127.0.0.1]", code: diag.RuleHost},
		{name: "name in brackets", in: "[example.com]", code: diag.RuleHost},
		{name: "ipv6 zone", in: "[fe80::1%eth0]", code: diag.RuleHost},
		{name: "bad ipv6", in: "1:2:3", code: diag.RuleHost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			host, ip, isIP, err := NormalizeHost(tt.in)
			if tt.code != "" {
				var re *RuleError
				if !errors.As(err, &re) || re.Code != tt.code {
					t.Fatalf("NormalizeHost(%q) = %q, %v; want a %s error", tt.in, host, err, tt.code)
				}
				return
			}
			if err != nil || host != tt.want || isIP != tt.isIP {
				t.Fatalf("NormalizeHost(%q) = %q, %v, %v, %v; want %q, isIP %v", tt.in, host, ip, isIP, err, tt.want, tt.isIP)
			}
			if isIP && (ip.String() != host || ip.Is4In6()) {
				t.Fatalf("NormalizeHost(%q): ip %v does not agree with host %q", tt.in, ip, host)
			}
			if !isIP && ip.IsValid() {
				t.Fatalf("NormalizeHost(%q): a name came with ip %v", tt.in, ip)
			}
		})
	}
}

func TestSplitHostPort(t *testing.T) {
	tests := []struct {
		in, host string
		port     uint16
		bad      bool
	}{
		{in: "example.com", host: "example.com"},
		{in: "example.com:443", host: "example.com", port: 443},
		{in: "[::1]:8080", host: "::1", port: 8080},
		{in: "[::1]", host: "::1"},
		{in: "::1", host: "::1"},
		{in: "example.com:+1", bad: true},
		{in: "example.com:-1", bad: true},
		{in: "example.com:01", bad: true},
		{in: "[::1]:", bad: true},
	}
	for _, tt := range tests {
		host, port, err := SplitHostPort(tt.in)
		if tt.bad {
			if err == nil {
				t.Errorf("SplitHostPort(%q) = %q, %d; want an error", tt.in, host, port)
			}
			continue
		}
		if err != nil || host != tt.host || port != tt.port {
			t.Errorf("SplitHostPort(%q) = %q, %d, %v; want %q, %d", tt.in, host, port, err, tt.host, tt.port)
		}
	}
}

func TestParseRule(t *testing.T) {
	v4 := netip.MustParseAddr
	pfx := netip.MustParsePrefix
	tests := []struct {
		name  string
		in    string
		want  Rule
		canon string // the String of the result; "" when it is in
		code  diag.Code
	}{
		{name: "exact", in: "api.github.com", want: Rule{Host: "api.github.com"}},
		{name: "exact normalised", in: "API.GitHub.com.", want: Rule{Host: "api.github.com"}, canon: "api.github.com"},
		{name: "exact with port", in: "api.github.com:443", want: Rule{Host: "api.github.com", Port: 443}},
		{name: "negated", in: "!gist.github.com", want: Rule{Negate: true, Host: "gist.github.com"}},
		{name: "one label", in: "*.github.com", want: Rule{Host: "github.com", Wildcard: OneLabel}},
		{name: "any depth", in: "**.github.com", want: Rule{Host: "github.com", Wildcard: AnyDepth}},
		{name: "any depth tld", in: "**.com", want: Rule{Host: "com", Wildcard: AnyDepth}},
		{name: "all", in: "**", want: Rule{Wildcard: All}},
		{name: "all with port", in: "**:443", want: Rule{Wildcard: All, Port: 443}},
		{name: "negated all", in: "!**", want: Rule{Negate: true, Wildcard: All}},
		{name: "idn wildcard", in: "*.Bücher.de", want: Rule{Host: "xn--bcher-kva.de", Wildcard: OneLabel}, canon: "*.xn--bcher-kva.de"},
		{name: "ipv4", in: "10.0.0.1", want: Rule{IP: v4("10.0.0.1")}},
		{name: "ipv4 with port", in: "10.0.0.1:5432", want: Rule{IP: v4("10.0.0.1"), Port: 5432}},
		{name: "ipv4 shortened", in: "127.1", want: Rule{IP: v4("127.0.0.1")}, canon: "127.0.0.1"},
		{name: "ipv4 integer", in: "2852039166", want: Rule{IP: v4("169.254.169.254")}, canon: "169.254.169.254"},
		{name: "ipv6", in: "::1", want: Rule{IP: v4("::1")}},
		{name: "ipv6 bracketed", in: "[::1]", want: Rule{IP: v4("::1")}, canon: "::1"},
		{name: "ipv6 with port", in: "[2001:db8::1]:443", want: Rule{IP: v4("2001:db8::1"), Port: 443}},
		{name: "ipv4-mapped", in: "[::ffff:a9fe:a9fe]", want: Rule{IP: v4("169.254.169.254")}, canon: "169.254.169.254"},
		{name: "cidr", in: "10.0.0.0/8", want: Rule{Prefix: pfx("10.0.0.0/8")}},
		{name: "cidr with port", in: "10.0.0.0/8:443", want: Rule{Prefix: pfx("10.0.0.0/8"), Port: 443}},
		{name: "cidr host", in: "10.0.0.1/32", want: Rule{Prefix: pfx("10.0.0.1/32")}},
		{name: "cidr ipv6", in: "2001:db8::/32", want: Rule{Prefix: pfx("2001:db8::/32")}},
		{name: "cidr ipv6 port", in: "[2001:db8::/32]:443", want: Rule{Prefix: pfx("2001:db8::/32"), Port: 443}},
		{name: "cidr ipv4-mapped", in: "::ffff:10.0.0.0/104", want: Rule{Prefix: pfx("10.0.0.0/8")}, canon: "10.0.0.0/8"},
		{name: "negated cidr", in: "!169.254.0.0/16", want: Rule{Negate: true, Prefix: pfx("169.254.0.0/16")}},

		{name: "empty", in: "", code: diag.RuleEmpty},
		{name: "lone bang", in: "!", code: diag.RuleEmpty},
		{name: "port only", in: ":443", code: diag.RuleEmpty},
		{name: "lone star", in: "*", code: diag.RuleWildcard},
		{name: "triple star", in: "***", code: diag.RuleWildcard},
		{name: "middle wildcard", in: "a.*.b", code: diag.RuleWildcard},
		{name: "partial label", in: "*x.com", code: diag.RuleWildcard},
		{name: "suffix wildcard", in: "example.*", code: diag.RuleWildcard},
		{name: "two wildcards", in: "*.*.example.com", code: diag.RuleWildcard},
		{name: "star then double", in: "*.**.example.com", code: diag.RuleWildcard},
		{name: "wildcard nothing after", in: "*.", code: diag.RuleWildcard},
		{name: "double wildcard nothing after", in: "**.", code: diag.RuleWildcard},
		{name: "bracketed wildcard", in: "[**]", code: diag.RuleWildcard},
		{name: "double bang", in: "!!a.com", code: diag.RuleHost},
		{name: "port zero", in: "a.com:0", code: diag.RulePort},
		{name: "port leading zero", in: "a.com:0443", code: diag.RulePort},
		{name: "port too big", in: "a.com:65536", code: diag.RulePort},
		{name: "port word", in: "a.com:https", code: diag.RulePort},
		{name: "port star", in: "a.com:*", code: diag.RulePort},
		{name: "cidr bits set", in: "10.0.0.1/8", code: diag.RuleCIDR},
		{name: "cidr too long", in: "10.0.0.0/33", code: diag.RuleCIDR},
		{name: "cidr no bits", in: "10.0.0.0/", code: diag.RuleCIDR},
		{name: "cidr shortened", in: "10.0/8", code: diag.RuleCIDR},
		{name: "cidr ipv4 bracketed", in: "[10.0.0.0/8]", code: diag.RuleCIDR},
		{name: "wildcard on ip", in: "*.1.2.3.4", code: diag.RuleWildcardIP},
		{name: "wildcard on numeric", in: "**.2130706433", code: diag.RuleWildcardIP},
		{name: "wildcard on cidr", in: "*.10.0.0.0/8", code: diag.RuleWildcardIP},
		{name: "wildcard on ipv6", in: "*.::1", code: diag.RuleWildcardIP},
		{name: "bad host", in: "exa mple.com", code: diag.RuleHost},
		{name: "bad idn", in: "xn--zz.com", code: diag.RuleHost},
		{name: "bad numeric", in: "1.2.3.4.5", code: diag.RuleHost},
		{name: "url", in: "https://example.com", code: diag.RulePort},
		{name: "path", in: "example.com/x", code: diag.RuleCIDR},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRule(tt.in)
			if tt.code != "" {
				var re *RuleError
				if !errors.As(err, &re) || re.Code != tt.code {
					t.Fatalf("ParseRule(%q) = %+v, %v; want a %s error", tt.in, r, err, tt.code)
				}
				if re.Message == "" || re.Hint == "" || re.Input != tt.in {
					t.Fatalf("ParseRule(%q): error %+v lacks a message, hint or input", tt.in, re)
				}
				return
			}
			if err != nil || r != tt.want {
				t.Fatalf("ParseRule(%q) = %+v, %v; want %+v", tt.in, r, err, tt.want)
			}
			canon := tt.canon
			if canon == "" {
				canon = tt.in
			}
			if r.String() != canon {
				t.Fatalf("ParseRule(%q).String() = %q; want %q", tt.in, r.String(), canon)
			}
		})
	}
}

func TestParseRules(t *testing.T) {
	rules, errs := ParseRules([]string{"**.github.com", "!gist.github.com"})
	if len(errs) != 0 || len(rules) != 2 || rules[1].Host != "gist.github.com" {
		t.Fatalf("ParseRules(good) = %+v, %v", rules, errs)
	}
	rules, errs = ParseRules([]string{"ok.com", "a.*.b", "x.com:0", "fine.org"})
	if rules != nil {
		t.Fatalf("ParseRules(bad) returned rules %+v; want nil", rules)
	}
	if len(errs) != 2 || errs[0].Index != 1 || errs[0].Code != diag.RuleWildcard || errs[1].Index != 2 || errs[1].Code != diag.RulePort {
		t.Fatalf("ParseRules(bad) errors = %+v", errs)
	}
	if d := errs[0].Diagnostic(); d.Code != diag.RuleWildcard || d.Severity != diag.Error || d.Hint == "" {
		t.Fatalf("Diagnostic() = %+v", d)
	}
}

func TestMatch(t *testing.T) {
	rules := mustRules(t,
		"**.github.com",
		"!gist.github.com",
		"*.npmjs.org",
		"pypi.org:443",
		"10.0.0.0/8",
		"!10.1.0.0/16",
		"169.254.169.254:80",
		"2001:db8::/32",
		"[::1]:8080",
	)
	tests := []struct {
		host    string
		port    uint16
		matched string // the String of the matched rule; "" for none
		ok      bool
	}{
		{"github.com", 443, "**.github.com", true},
		{"api.github.com", 443, "**.github.com", true},
		{"a.b.github.com", 22, "**.github.com", true},
		{"GitHub.COM.", 443, "**.github.com", true},
		{"api.github.com:8443", 443, "**.github.com", true}, // the port in the host is ignored
		{"gist.github.com", 443, "!gist.github.com", false},
		{"GIST.github.com.", 443, "!gist.github.com", false},
		{"x.gist.github.com", 443, "**.github.com", true},
		{"notgithub.com", 443, "", false},
		{"github.com.evil.com", 443, "", false},
		{"registry.npmjs.org", 443, "*.npmjs.org", true},
		{"npmjs.org", 443, "", false},
		{"a.registry.npmjs.org", 443, "", false},
		{"pypi.org", 443, "pypi.org:443", true},
		{"pypi.org", 80, "", false},
		{"10.2.3.4", 5432, "10.0.0.0/8", true},
		{"012.2.3.4", 5432, "10.0.0.0/8", true}, // octal 012 is 10
		{"012.02.03.04", 5432, "10.0.0.0/8", true},
		{"167772161", 443, "10.0.0.0/8", true}, // 10.0.0.1
		{"10.1.2.3", 443, "!10.1.0.0/16", false},
		{"[::ffff:10.1.2.3]", 443, "!10.1.0.0/16", false},
		{"169.254.169.254", 80, "169.254.169.254:80", true},
		{"169.254.169.254", 443, "", false},
		{"0xa9.0xfe.0xa9.0xfe", 80, "169.254.169.254:80", true},
		{"[::ffff:a9fe:a9fe]", 80, "169.254.169.254:80", true},
		{"[2001:db8::5]", 443, "2001:db8::/32", true},
		{"::1", 8080, "[::1]:8080", true},
		{"::1", 80, "", false},
		{"10.github.com", 443, "**.github.com", true},
		{"bad host!", 443, "", false},
	}
	for _, tt := range tests {
		r, ok := Match(rules, tt.host, tt.port)
		got := ""
		if r != nil {
			got = r.String()
		}
		if got != tt.matched || ok != tt.ok {
			t.Errorf("Match(%q, %d) = %q, %v; want %q, %v", tt.host, tt.port, got, ok, tt.matched, tt.ok)
		}
	}
}

func TestMatchAllAndIPv6Prefixes(t *testing.T) {
	rules := mustRules(t, "**")
	for _, h := range []string{"example.com", "127.0.0.1", "::1"} {
		if r, ok := Match(rules, h, 1); r == nil || !ok {
			t.Errorf("** does not match %q", h)
		}
	}
	// ::/0 covers IPv4 as IPv4-mapped addresses, so a denylist written in IPv6 terms does not leak IPv4.
	rules = mustRules(t, "**", "!::/0")
	if _, ok := Match(rules, "127.0.0.1", 80); ok {
		t.Error("!::/0 does not deny 127.0.0.1")
	}
	if _, ok := Match(rules, "example.com", 80); !ok {
		t.Error("!::/0 denies a name")
	}
	if _, ok := MatchAddr(rules, netip.MustParseAddr("::ffff:1.2.3.4"), 80); ok {
		t.Error("!::/0 does not deny a mapped address")
	}
	if r, ok := MatchAddr(mustRules(t, "1.2.3.4"), netip.MustParseAddr("::ffff:1.2.3.4"), 80); r == nil || !ok {
		t.Error("MatchAddr does not unmap")
	}
	if r, _ := MatchAddr(mustRules(t, "**"), netip.Addr{}, 80); r != nil {
		t.Error("MatchAddr matched the zero address")
	}
	if r, _ := Match(nil, "example.com", 443); r != nil {
		t.Error("no rules matched")
	}
}

func mustRules(t *testing.T, in ...string) []Rule {
	t.Helper()
	rules, errs := ParseRules(in)
	if errs != nil {
		t.Fatalf("ParseRules: %v", errs)
	}
	return rules
}
