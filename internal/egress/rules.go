package egress

// The rule language: a rule names a host (exact, "*.x", "**.x" or "**"), an IP address or a CIDR, optionally
// a port, optionally negated with a leading "!"; hosts are normalised (case, trailing dot, port, IDN, every
// numeric IPv4 spelling) before they are compared, and the last matching rule wins. A bad rule is a
// *RuleError with a stable SK3xx code.

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"

	"github.com/sandkeep/sandkeep/internal/diag"
)

// Limits on what is parsed at all. A DNS name is at most 253 bytes; the input may be longer before IDN
// conversion (non-ASCII letters take several bytes), but not without bound.
const (
	maxNameLen  = 253
	maxLabelLen = 63
	maxInputLen = 1024
)

// Kind is the shape of a host rule.
type Kind uint8

// Kinds. IP and CIDR rules are Exact.
const (
	Exact    Kind = iota // the host itself
	OneLabel             // "*.x": exactly one label in front of x; not x itself
	AnyDepth             // "**.x": x itself, or one or more labels in front of it
	All                  // "**": every host, name or IP address
)

// String is the kind's name.
func (k Kind) String() string {
	switch k {
	case Exact:
		return "exact"
	case OneLabel:
		return "one-label"
	case AnyDepth:
		return "any-depth"
	case All:
		return "all"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Rule is one parsed network rule. Exactly one of these describes what it names: Prefix (a CIDR) when valid,
// else IP when valid, else Host with its Wildcard (Host is "" for All). Rules from ParseRule are canonical:
// Host is normalised, IPv4-mapped IPv6 addresses and prefixes are stored as IPv4, prefixes are masked, so
// two rules that name the same thing compare equal with ==.
type Rule struct {
	Negate   bool         // a leading "!": a match denies
	Host     string       // the normalised name, or the suffix after "*." / "**."
	Wildcard Kind         // how Host is matched
	IP       netip.Addr   // an IP rule
	Prefix   netip.Prefix // a CIDR rule
	Port     uint16       // 0: any port
}

// String is the rule's canonical spelling; ParseRule(r.String()) == r for every rule ParseRule returns.
// An IPv6 address or prefix with a port is bracketed: "[2001:db8::/32]:443".
func (r Rule) String() string {
	var b strings.Builder
	if r.Negate {
		b.WriteByte('!')
	}
	host, v6 := "", false
	switch {
	case r.Prefix.IsValid():
		host, v6 = r.Prefix.String(), r.Prefix.Addr().Is6()
	case r.IP.IsValid():
		host, v6 = r.IP.String(), r.IP.Is6()
	case r.Wildcard == All:
		host = "**"
	case r.Wildcard == AnyDepth:
		host = "**." + r.Host
	case r.Wildcard == OneLabel:
		host = "*." + r.Host
	default:
		host = r.Host
	}
	if r.Port != 0 && v6 {
		host = "[" + host + "]"
	}
	b.WriteString(host)
	if r.Port != 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(int(r.Port)))
	}
	return b.String()
}

// RuleError is a rule or host that cannot be parsed. Code is one of the diag SK3xx codes.
type RuleError struct {
	Code    diag.Code
	Index   int    // the rule's position in the list given to ParseRules; 0 otherwise
	Input   string // the rule or host as given
	Message string // one sentence, naming the input
	Hint    string // what to write instead
}

func (e *RuleError) Error() string {
	s := string(e.Code) + " " + e.Message
	if e.Hint != "" {
		s += " (hint: " + e.Hint + ")"
	}
	return s
}

// Diagnostic is e as an error diagnostic without a position; the caller that knows where the rule was
// written sets File, Line and Column.
func (e *RuleError) Diagnostic() diag.Diagnostic {
	return diag.Diagnostic{Code: e.Code, Severity: diag.Error, Message: e.Message, Hint: e.Hint}
}

// quote quotes an input for a message, cut at 80 bytes so one huge input does not make a huge message.
func quote(s string) string {
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return strconv.Quote(s)
}

// fail builds a *RuleError whose message starts with what (`rule "x"` or `host "x"`).
func fail(code diag.Code, input, what, hint, format string, args ...any) *RuleError {
	return &RuleError{Code: code, Input: input, Message: what + " " + fmt.Sprintf(format, args...), Hint: hint}
}

// Hints, one per kind of mistake.
const (
	hintRule     = `write a host (api.example.com), *.example.com, **.example.com, **, an IP (10.0.0.1, ::1) or a CIDR (10.0.0.0/8), optionally with :port and a leading !`
	hintWildcard = `a wildcard is a whole first label: *.example.com (one label), **.example.com (any depth, and example.com), or ** alone (every host)`
	hintPort     = `write a decimal port from 1 to 65535 (api.example.com:443), or leave it out for any port`
	hintHost     = `write a DNS name of letters, digits, hyphens and dots (non-ASCII names are converted to punycode), or an IP address`
	hintIPv6     = `write an IPv6 address in brackets when it has a port: [2001:db8::1]:443`
	hintWildIP   = `a wildcard applies to names only; to cover a range of addresses write a CIDR such as 10.0.0.0/8`
)

// ParseRule parses one rule: [!] (host | *.host | **.host | ** | ip | cidr) [:port], where an IPv6 address or
// prefix takes a port only in brackets. Hosts are normalised as NormalizeHost does, so a numeric spelling of
// an address ("0x7f.1") is an IP rule. The error is a *RuleError.
func ParseRule(s string) (Rule, error) {
	r, err := parseRule(s)
	if err != nil {
		return Rule{}, err
	}
	return r, nil
}

// ParseRules parses every rule and reports every bad one, with its Index. It returns the rules only when all
// of them parse (a policy with a rule left out would be a different policy), else nil.
func ParseRules(in []string) ([]Rule, []*RuleError) {
	rules := make([]Rule, 0, len(in))
	var errs []*RuleError
	for i, s := range in {
		r, err := parseRule(s)
		if err != nil {
			err.Index = i
			errs = append(errs, err)
			continue
		}
		rules = append(rules, r)
	}
	if errs != nil {
		return nil, errs
	}
	return rules, nil
}

func parseRule(s string) (Rule, *RuleError) {
	what := "rule " + quote(s)
	if len(s) > maxInputLen {
		return Rule{}, fail(diag.RuleHost, s, what, hintRule, "is %d bytes long, over the limit of %d", len(s), maxInputLen)
	}
	var r Rule
	body := s
	if strings.HasPrefix(body, "!") {
		r.Negate, body = true, body[1:]
	}
	if body == "" {
		if r.Negate {
			return Rule{}, fail(diag.RuleEmpty, s, what, hintRule, "negates nothing")
		}
		return Rule{}, fail(diag.RuleEmpty, s, "rule", hintRule, "is empty")
	}
	host, bracketed, port, err := splitHostPort(s, what, body)
	if err != nil {
		return Rule{}, err
	}
	r.Port = port
	if strings.Contains(host, "/") {
		p, err := parsePrefix(s, what, host, bracketed)
		if err != nil {
			return Rule{}, err
		}
		r.Prefix = p
		return r, nil
	}
	if host == "**" && !bracketed {
		r.Wildcard = All
		return r, nil
	}
	if host == "" {
		return Rule{}, fail(diag.RuleEmpty, s, what, hintRule, "has an empty host")
	}
	kind := Exact
	switch {
	case bracketed:
	case strings.HasPrefix(host, "**."):
		kind, host = AnyDepth, host[len("**."):]
	case strings.HasPrefix(host, "*."):
		kind, host = OneLabel, host[len("*."):]
	}
	switch {
	case host == "*":
		return Rule{}, fail(diag.RuleWildcard, s, what, hintWildcard, "has a lone *, which is not a rule (** is every host)")
	case strings.Contains(host, "*"):
		return Rule{}, fail(diag.RuleWildcard, s, what, hintWildcard, "has a wildcard that is not the whole first label")
	case host == "":
		return Rule{}, fail(diag.RuleWildcard, s, what, hintWildcard, "has a wildcard with no domain after it")
	case kind != Exact && strings.ContainsAny(host, ":[]"):
		return Rule{}, fail(diag.RuleWildcardIP, s, what, hintWildIP, "puts a wildcard on an IPv6 address")
	}
	name, ip, isIP, err := normalize(s, what, host, bracketed)
	if err != nil {
		return Rule{}, err
	}
	if isIP {
		if kind != Exact {
			return Rule{}, fail(diag.RuleWildcardIP, s, what, hintWildIP, "puts a wildcard on the IP address %s", ip)
		}
		r.IP = ip
		return r, nil
	}
	r.Host, r.Wildcard = name, kind
	return r, nil
}

// parsePrefix parses a CIDR rule's address part: standard notation only, masked, IPv4-mapped stored as IPv4.
func parsePrefix(input, what, host string, bracketed bool) (netip.Prefix, *RuleError) {
	const hint = "write a network address and prefix length: 10.0.0.0/8, 2001:db8::/32"
	if strings.Contains(host, "*") {
		return netip.Prefix{}, fail(diag.RuleWildcardIP, input, what, hintWildIP, "puts a wildcard on a CIDR")
	}
	p, err := netip.ParsePrefix(host)
	if err != nil {
		return netip.Prefix{}, fail(diag.RuleCIDR, input, what, hint, "is not a valid CIDR")
	}
	if bracketed && !p.Addr().Is6() {
		return netip.Prefix{}, fail(diag.RuleCIDR, input, what, hint, "puts an IPv4 CIDR in brackets, which are for IPv6")
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, fail(diag.RuleCIDR, input, what, "write "+m.String(), "has bits set past its prefix length /%d", p.Bits())
	}
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p, nil
}

// SplitHostPort splits "host:port", "[ipv6]:port", "[ipv6]", a bare IPv6 address (which has no port) or a
// bare host. The host comes back without brackets; port is 0 when there is none. The error is a *RuleError
// (SK303 for a bad port, SK305 for bad brackets).
func SplitHostPort(s string) (host string, port uint16, err error) {
	h, _, p, rerr := splitHostPort(s, "host "+quote(s), s)
	if rerr != nil {
		return "", 0, rerr
	}
	return h, p, nil
}

// splitHostPort is SplitHostPort on body (the part of input after any "!"), reporting whether the host was
// bracketed (then it must be an IPv6 address or prefix).
func splitHostPort(input, what, body string) (host string, bracketed bool, port uint16, err *RuleError) {
	var portText string
	hasPort := false
	switch {
	case strings.HasPrefix(body, "["):
		end := strings.IndexByte(body, ']')
		if end < 0 {
			return "", false, 0, fail(diag.RuleHost, input, what, hintIPv6, "has a [ without a closing ]")
		}
		host, bracketed = body[1:end], true
		rest := body[end+1:]
		if rest != "" {
			if rest[0] != ':' {
				return "", false, 0, fail(diag.RuleHost, input, what, hintIPv6, "has %s after its closing ]", quote(rest))
			}
			portText, hasPort = rest[1:], true
		}
	case strings.Count(body, ":") == 1:
		host, portText, _ = strings.Cut(body, ":")
		hasPort = true
	default: // no colon, or a bare IPv6 address, which cannot carry a port
		host = body
	}
	if hasPort {
		p, ok := parsePort(portText)
		if !ok {
			return "", false, 0, fail(diag.RulePort, input, what, hintPort, "has the port %s, which is not a decimal number from 1 to 65535", quote(portText))
		}
		port = p
	}
	return host, bracketed, port, nil
}

// parsePort accepts 1..65535 in decimal without sign or leading zeros: one spelling per port.
func parsePort(s string) (uint16, bool) {
	if s == "" || len(s) > 5 || s[0] == '0' {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	if n > 65535 {
		return 0, false
	}
	return uint16(n), true
}

// NormalizeHost returns the canonical form of a host as a client may send it (in CONNECT, a Host header or a
// URL): ASCII lower case, one trailing dot and any :port removed (SplitHostPort returns the port), an IDN
// converted to punycode with the IDNA2008 lookup profile (golang.org/x/net/idna.Lookup), and every numeric
// spelling of an IPv4 address — shortened (127.1), hexadecimal or octal parts (0x7f.1, 0177.0.0.1), a single
// 32-bit number (2130706433) — read as the address it denotes, the way inet_aton and browsers read it. A host
// whose last label is numeric but does not form an address ("a.1", "1.2.3.4.5") is refused, never taken as a
// name. IPv6 comes bare or in brackets; an IPv4-mapped address ([::ffff:a9fe:a9fe]) is returned as the IPv4
// address (169.254.169.254). For an IP, host is ip.String() and isIP is true. NormalizeHost is idempotent.
// The error is a *RuleError.
func NormalizeHost(h string) (host string, ip netip.Addr, isIP bool, err error) {
	what := "host " + quote(h)
	if len(h) > maxInputLen {
		return "", netip.Addr{}, false, fail(diag.RuleHost, h, what, hintHost, "is %d bytes long, over the limit of %d", len(h), maxInputLen)
	}
	name, bracketed, _, rerr := splitHostPort(h, what, h)
	if rerr != nil {
		return "", netip.Addr{}, false, rerr
	}
	host, ip, isIP, rerr = normalize(h, what, name, bracketed)
	if rerr != nil {
		return "", netip.Addr{}, false, rerr
	}
	return host, ip, isIP, nil
}

// normalize is NormalizeHost on a host already split from its port.
func normalize(input, what, h string, bracketed bool) (string, netip.Addr, bool, *RuleError) {
	if h == "" {
		if input == "" {
			return "", netip.Addr{}, false, fail(diag.RuleEmpty, input, what, hintHost, "is empty")
		}
		return "", netip.Addr{}, false, fail(diag.RuleEmpty, input, what, hintHost, "has an empty host")
	}
	if bracketed || strings.Contains(h, ":") {
		a, err := netip.ParseAddr(h)
		switch {
		case err != nil || !a.Is6():
			return "", netip.Addr{}, false, fail(diag.RuleHost, input, what, hintIPv6, "is not a valid IPv6 address")
		case a.Zone() != "":
			return "", netip.Addr{}, false, fail(diag.RuleHost, input, what, "leave out the %zone: a sandbox's traffic has no interface of its own", "has an IPv6 zone")
		}
		a = a.Unmap()
		return a.String(), a, true, nil
	}
	if !utf8.ValidString(h) {
		return "", netip.Addr{}, false, fail(diag.RuleHost, input, what, hintHost, "is not valid UTF-8")
	}
	lower := asciiLower(h)
	for i := 0; i < len(lower); i++ {
		if c := lower[i]; c < 0x80 && !isLDH(c) && c != '.' {
			return "", netip.Addr{}, false, fail(diag.RuleHost, input, what, hintHost, "contains %q", c)
		}
	}
	name, err := idna.Lookup.ToASCII(lower)
	if err != nil {
		why := "is not a valid internationalised domain name"
		if isASCII(lower) {
			if w := checkName(strings.TrimSuffix(lower, ".")); w != "" {
				why = w // the more precise reason, for a plain ASCII name
			}
		}
		return "", netip.Addr{}, false, fail(diag.RuleHost, input, what, hintHost, "%s", why)
	}
	// The result must be a fixed point of the conversion, or NormalizeHost would not be idempotent (and two
	// spellings of one host could be compared as different names).
	if again, err := idna.Lookup.ToASCII(name); err != nil || again != name {
		return "", netip.Addr{}, false, fail(diag.RuleHost, input, what, hintHost, "is not a valid internationalised domain name")
	}
	name = strings.TrimSuffix(name, ".")
	if name == "" {
		return "", netip.Addr{}, false, fail(diag.RuleEmpty, input, what, hintHost, "has an empty host")
	}
	if endsInNumber(name) {
		a, ok := parseIPv4(name)
		if !ok {
			return "", netip.Addr{}, false, fail(diag.RuleHost, input, what, "write a dotted-quad address such as 10.0.0.1, or a name whose last label is not a number",
				"ends in a number but is not an IPv4 address")
		}
		return a.String(), a, true, nil
	}
	if why := checkName(name); why != "" {
		return "", netip.Addr{}, false, fail(diag.RuleHost, input, what, hintHost, "%s", why)
	}
	return name, netip.Addr{}, false, nil
}

// checkName reports why an ASCII name is not a DNS name (labels of 1..63 letters, digits and inner hyphens,
// 253 bytes in all), or "".
func checkName(name string) string {
	if len(name) > maxNameLen {
		return fmt.Sprintf("is %d bytes long as a DNS name, over the limit of %d", len(name), maxNameLen)
	}
	for _, label := range strings.Split(name, ".") {
		switch {
		case label == "":
			return "has an empty label"
		case len(label) > maxLabelLen:
			return fmt.Sprintf("has a label of %d bytes, over the limit of %d", len(label), maxLabelLen)
		case label[0] == '-' || label[len(label)-1] == '-':
			return "has a label that starts or ends with a hyphen"
		}
		for i := 0; i < len(label); i++ {
			if !isLDH(label[i]) {
				return fmt.Sprintf("contains %q", label[i])
			}
		}
	}
	return ""
}

// isLDH reports whether c is a lower-case letter, a digit or a hyphen.
func isLDH(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-'
}

// isASCII reports whether s is all ASCII.
func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// asciiLower lower-cases ASCII letters only; the IDNA mapping folds the rest.
func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if c := b[j]; c >= 'A' && c <= 'Z' {
					b[j] = c + 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// endsInNumber reports whether the last label of name is a decimal or 0x-hexadecimal number: such a host is
// an IPv4 address or nothing (the WHATWG URL host rule).
func endsInNumber(name string) bool {
	last := name[strings.LastIndexByte(name, '.')+1:]
	if last == "" {
		return false
	}
	if strings.HasPrefix(last, "0x") {
		return allDigits(last[2:], 16)
	}
	return allDigits(last, 10)
}

// allDigits reports whether every byte of s is a digit in base (10 or 16); "" is true.
func allDigits(s string, base int) bool {
	for i := 0; i < len(s); i++ {
		if _, ok := digit(s[i], base); !ok {
			return false
		}
	}
	return true
}

// digit is the value of c in base, if it is a digit there (lower-case hex only: input is lower-cased).
func digit(c byte, base int) (uint64, bool) {
	var d uint64
	switch {
	case c >= '0' && c <= '9':
		d = uint64(c - '0')
	case c >= 'a' && c <= 'f':
		d = uint64(c-'a') + 10
	default:
		return 0, false
	}
	return d, d < uint64(base)
}

// parseIPv4 reads inet_aton's forms: one to four parts separated by dots, each decimal, 0x-hexadecimal or
// 0-prefixed octal, all but the last at most 255, the last filling the remaining bytes.
func parseIPv4(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	nums := make([]uint64, len(parts))
	for i, p := range parts {
		n, ok := parseIPv4Part(p)
		if !ok {
			return netip.Addr{}, false
		}
		nums[i] = n
	}
	last := len(nums) - 1
	if nums[last] >= 1<<(8*(4-last)) {
		return netip.Addr{}, false
	}
	v := nums[last]
	for i, n := range nums[:last] {
		if n > 255 {
			return netip.Addr{}, false
		}
		v |= n << (8 * (3 - i))
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

// parseIPv4Part reads one part; a value over 2^32 is refused as soon as it is seen.
func parseIPv4Part(p string) (uint64, bool) {
	if p == "" {
		return 0, false
	}
	base := 10
	switch {
	case strings.HasPrefix(p, "0x"):
		p, base = p[2:], 16
	case len(p) > 1 && p[0] == '0':
		p, base = p[1:], 8
	}
	var n uint64
	for i := 0; i < len(p); i++ {
		d, ok := digit(p[i], base)
		if !ok {
			return 0, false
		}
		n = n*uint64(base) + d
		if n > 1<<32 {
			return 0, false
		}
	}
	return n, true
}

// Match returns the last rule that matches host and port, and ok when that rule is not negated. host is
// normalised first (a port in it is ignored: port is the one that counts); a host that does not normalise
// matches nothing. matched is nil when no rule matches: what that means (deny for an allowlist, allow for a
// denylist) is the network mode's to say. Names match host rules only and IP addresses match IP and CIDR
// rules only, except "**", which matches both. IPv4 addresses are also matched against IPv6 prefixes as
// IPv4-mapped addresses, so ::/0 covers them.
func Match(rules []Rule, host string, port uint16) (matched *Rule, ok bool) {
	name, ip, isIP, err := NormalizeHost(host)
	if err != nil {
		return nil, false
	}
	return match(rules, name, ip, isIP, port)
}

// MatchAddr is Match for an address already resolved, such as the one the proxy is about to dial.
func MatchAddr(rules []Rule, addr netip.Addr, port uint16) (matched *Rule, ok bool) {
	addr = addr.Unmap().WithZone("")
	if !addr.IsValid() {
		return nil, false
	}
	return match(rules, addr.String(), addr, true, port)
}

func match(rules []Rule, name string, ip netip.Addr, isIP bool, port uint16) (*Rule, bool) {
	for i := len(rules) - 1; i >= 0; i-- {
		if rules[i].matches(name, ip, isIP, port) {
			return &rules[i], !rules[i].Negate
		}
	}
	return nil, false
}

// matches reports whether r covers the normalised host and port.
func (r *Rule) matches(name string, ip netip.Addr, isIP bool, port uint16) bool {
	if r.Port != 0 && r.Port != port {
		return false
	}
	switch {
	case r.Prefix.IsValid():
		if !isIP {
			return false
		}
		if r.Prefix.Addr().Is6() && ip.Is4() {
			return r.Prefix.Contains(netip.AddrFrom16(ip.As16()))
		}
		return r.Prefix.Contains(ip)
	case r.IP.IsValid():
		return isIP && r.IP == ip
	case r.Wildcard == All:
		return true
	case isIP:
		return false
	}
	switch r.Wildcard {
	case Exact:
		return name == r.Host
	case AnyDepth:
		return name == r.Host || strings.HasSuffix(name, "."+r.Host)
	case OneLabel:
		head, ok := strings.CutSuffix(name, "."+r.Host)
		return ok && head != "" && !strings.Contains(head, ".")
	}
	return false
}
