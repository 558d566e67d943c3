package egress

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// TLS inspection settings (Policy.Inspect).
const (
	InspectAuto = "auto" // also "": on when the policy has credentials, else off
	InspectOn   = "on"   // always: every CONNECT is decrypted, checked and re-encrypted
	InspectOff  = "off"  // never: CONNECT is a plain tunnel, so credentials reach plain-HTTP requests only
)

// Bounds on credentials. A short value or placeholder would be found by chance in unrelated traffic, which
// the proxy would then refuse as a leak (or, for a placeholder, rewrite).
const (
	minPlaceholderLen = 16
	minValueLen       = 8
	maxCredentials    = 64
)

// Credential is a secret the proxy injects on the sandbox's behalf. The sandbox only ever sees Placeholder; on a
// request to a host that matches Hosts (last match wins, as for policy rules), over inspected TLS (or plain HTTP
// when AllowPlaintext), the proxy puts Value where the definition says and nowhere else: in Header, when the
// sandbox wrote "<Scheme> <Placeholder>" there, and in the Fields it opts into. It refuses any request to any
// other host that carries the Placeholder or the Value (see the package doc for exactly where it looks), and
// scrubs every form of Value it produced from the responses. Value never appears in a Block, an error or a log.
type Credential struct {
	Name        string // names the credential in a refusal's Block.Rule and in errors; never the value
	Placeholder string // what the sandbox sees: 16+ printable ASCII bytes, no spaces (NewPlaceholder makes one)
	Value       string // the secret: 8+ bytes, no CR, LF or NUL (it may be written into a header)
	Hosts       []Rule // where Value may go

	// Header is the request header Value goes in; "" is Authorization.
	Header string
	// Scheme is the word before the value in Header: "" is Bearer in Authorization and none in any other header;
	// SchemeNone for none (the header's value is the placeholder alone); Basic takes the placeholder as the user
	// or the password of a Basic credential; any other token (token, Bot, ...) as written.
	Scheme string
	// AllowPlaintext lets Value go into plain-HTTP requests; without it, only into inspected TLS, and a plain
	// request to the host that carries the placeholder is refused (credential-plaintext).
	AllowPlaintext bool
	// Fields are other places Value may go, each opted into by name: "header:<Name>" (a header whose whole value
	// is the placeholder), "form:<name>" (a form field of the body) or "json:<name>" (a JSON member of the body,
	// at any depth), in the first MiB of the body, where the placeholder is the whole value.
	Fields []string
}

// SchemeNone is the Credential.Scheme of a header whose value is the secret alone.
const SchemeNone = "none"

// NewPlaceholder returns a fresh placeholder for the credential name: "SANDKEEP_CRED_<NAME>_<32 hex>", where
// NAME is name upper-cased with every byte other than a letter or digit written as "_" (at most 32 bytes). It
// contains only letters, digits and "_", so URL, JSON and form encodings leave it as it is.
func NewPlaceholder(name string) string {
	var b strings.Builder
	b.WriteString("SANDKEEP_CRED_")
	for i := 0; i < len(name) && i < 32; i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z':
			c -= 'a' - 'A'
		case c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		default:
			c = '_'
		}
		b.WriteByte(c)
	}
	if name == "" {
		b.WriteByte('X')
	}
	var r [16]byte
	_, _ = rand.Read(r[:]) // crypto/rand.Read never fails (it crashes the program instead)
	b.WriteByte('_')
	b.WriteString(strings.ToUpper(hex.EncodeToString(r[:])))
	return b.String()
}

// policy is a Policy checked and compiled: immutable once built, swapped whole by SetPolicy, so a request
// that loaded it sees one consistent policy from its decision to its forwarding.
type policy struct {
	mode    string
	rules   []Rule // last match wins
	ipRules []Rule // the IP and CIDR rules among them: the only ones that unlock a refused address class
	silent  []Rule
	creds   []credential
	inspect bool
	scope   caScope    // the name constraints a CA for this policy carries
	narrow  *narrowing // a caller's narrowing; nil: none
}

// credential is a Credential as the proxy uses it.
type credential struct {
	name        string
	placeholder string
	value       string
	hosts       []Rule
	header      string   // canonical
	scheme      string   // "" for none
	basic       bool     // scheme is Basic
	plaintext   bool     // AllowPlaintext
	headers     []string // Fields' headers, canonical
	form, json  []string // Fields' body fields
}

// compile checks pol the way New and SetPolicy do and returns it compiled. Errors are fault.NetworkInvalid
// and name a credential by its Name, never by its value.
func compile(pol Policy) (*policy, error) {
	const hint = "fix the network block of the spec"
	c := &policy{mode: pol.Mode}
	switch c.mode {
	case "":
		c.mode = ModeNone
	case ModeNone, ModeAllowlist, ModeDenylist, ModeOpen:
	default:
		return nil, fault.New(fault.NetworkInvalid, "write none, allowlist, denylist or open",
			"the network mode %q is unknown", cut(pol.Mode))
	}
	silent, errs := ParseRules(pol.Silent)
	if errs != nil {
		return nil, fault.Wrap(errs[0], fault.NetworkInvalid, hint, "the silent list has a bad rule: %s", errs[0].Message)
	}
	for _, r := range silent {
		if r.Negate {
			return nil, fault.New(fault.NetworkInvalid, "list hosts to refuse without an event, without a leading !",
				"the silent list's rule %q is negated, which means nothing there", r.String())
		}
	}
	c.silent = silent
	narrow, err := compileNarrowing(pol.Narrow)
	if err != nil {
		return nil, err
	}
	c.narrow = narrow
	c.rules = slices.Clone(pol.Rules)
	for _, r := range c.rules {
		if r.IP.IsValid() || r.Prefix.IsValid() {
			c.ipRules = append(c.ipRules, r)
		}
	}
	if len(pol.Credentials) > maxCredentials {
		return nil, fault.New(fault.NetworkInvalid, hint, "%d credentials, over the limit of %d", len(pol.Credentials), maxCredentials)
	}
	seen := map[string]string{} // placeholder -> name
	for _, in := range pol.Credentials {
		cr, err := compileCredential(in)
		if err != nil {
			return nil, err
		}
		if other, dup := seen[cr.placeholder]; dup {
			return nil, fault.New(fault.NetworkInvalid, "give every credential its own placeholder (NewPlaceholder)",
				"credentials %q and %q share a placeholder", other, cr.name)
		}
		seen[cr.placeholder] = cr.name
		c.creds = append(c.creds, cr)
	}
	switch pol.Inspect {
	case "", InspectAuto:
		c.inspect = len(c.creds) > 0
	case InspectOn:
		c.inspect = true
	case InspectOff:
	default:
		return nil, fault.New(fault.NetworkInvalid, "write auto, on or off", "the TLS inspection setting %q is unknown", cut(pol.Inspect))
	}
	c.scope = scopeOf(c)
	return c, nil
}

func compileCredential(in Credential) (credential, error) {
	name := in.Name
	if name == "" {
		return credential{}, fault.New(fault.NetworkInvalid, "name every credential", "a credential has no name")
	}
	if len(name) > 128 || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return credential{}, fault.New(fault.NetworkInvalid, "use a short name without control characters",
			"the credential name %q is too long or has control characters", cut(name))
	}
	switch {
	case len(in.Placeholder) < minPlaceholderLen:
		return credential{}, fault.New(fault.NetworkInvalid, "make placeholders with NewPlaceholder",
			"credential %q has a placeholder shorter than %d bytes, which could match unrelated text", name, minPlaceholderLen)
	case strings.ContainsFunc(in.Placeholder, func(r rune) bool { return r <= ' ' || r >= 0x7f }):
		return credential{}, fault.New(fault.NetworkInvalid, "make placeholders with NewPlaceholder",
			"credential %q has a placeholder with spaces, control or non-ASCII characters", name)
	case len(in.Value) < minValueLen:
		return credential{}, fault.New(fault.NetworkInvalid, "inject secrets of at least 8 bytes",
			"credential %q has a value shorter than %d bytes, which would be found by chance in unrelated traffic", name, minValueLen)
	case strings.ContainsAny(in.Value, "\r\n\x00"):
		return credential{}, fault.New(fault.NetworkInvalid, "remove the line break or NUL from the secret",
			"credential %q has a value with a line break or NUL, which cannot go into a header", name)
	case strings.Contains(in.Value, in.Placeholder) || strings.Contains(in.Placeholder, in.Value):
		return credential{}, fault.New(fault.NetworkInvalid, "make placeholders with NewPlaceholder",
			"credential %q has a placeholder and a value that contain one another", name)
	case len(in.Hosts) == 0:
		return credential{}, fault.New(fault.NetworkInvalid, "list the hosts the secret may be sent to",
			"credential %q names no host it may be sent to", name)
	}
	cr := credential{name: name, placeholder: in.Placeholder, value: in.Value, hosts: slices.Clone(in.Hosts), plaintext: in.AllowPlaintext}
	if err := placement(&cr, in.Header, in.Scheme, in.Fields); err != nil {
		return credential{}, fault.Wrap(err, fault.NetworkInvalid, err.Hint, "credential %q: %s", name, err.Message)
	}
	return cr, nil
}

// placement fills in where cr's value goes: header (default Authorization), scheme (default Bearer there, none
// elsewhere), and the fields opted into. Errors are fault.NetworkInvalid.
func placement(cr *credential, header, scheme string, fields []string) *fault.Error {
	cr.header = "Authorization"
	if header != "" {
		if !validToken(header) {
			return fault.New(fault.NetworkInvalid, "name a request header, e.g. header: X-Api-Key",
				"%q is not a header name", cut(header))
		}
		cr.header = http.CanonicalHeaderKey(header)
	}
	switch {
	case scheme == "" && cr.header == "Authorization":
		cr.scheme = "Bearer"
	case scheme == "" || strings.EqualFold(scheme, SchemeNone):
	case !validToken(scheme):
		return fault.New(fault.NetworkInvalid, "write the word before the secret, e.g. scheme: Bearer, Basic, token or none",
			"the scheme %q is not a single word", cut(scheme))
	default:
		cr.scheme = scheme
		cr.basic = strings.EqualFold(scheme, "Basic")
	}
	for _, f := range fields {
		kind, field, _ := strings.Cut(f, ":")
		ok := field != "" && len(field) <= 128 && !strings.ContainsFunc(field, func(r rune) bool { return r < 0x21 || r == 0x7f || r == '"' || r == '\\' })
		switch {
		case !ok:
		case kind == "header" && validToken(field):
			cr.headers = append(cr.headers, http.CanonicalHeaderKey(field))
			continue
		case kind == "form":
			cr.form = append(cr.form, field)
			continue
		case kind == "json":
			cr.json = append(cr.json, field)
			continue
		}
		return fault.New(fault.NetworkInvalid, "write header:<Name>, form:<field> or json:<member>",
			"the field %q is not one the proxy can inject into", cut(f))
	}
	return nil
}

// CheckCredentialPlacement checks a credential's Header, Scheme and Fields the way New does, so a spec can be
// refused before any command runs. Errors are a *fault.Error (NetworkInvalid) with a hint.
func CheckCredentialPlacement(header, scheme string, fields []string) error {
	var cr credential
	if err := placement(&cr, header, scheme, fields); err != nil {
		return err
	}
	return nil
}

// validToken reports whether s is an HTTP token (RFC 9110): what a header name and an auth scheme are.
func validToken(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// equal reports whether c and o are the same policy.
func (c *policy) equal(o *policy) bool {
	return c.mode == o.mode && c.inspect == o.inspect && slices.Equal(c.rules, o.rules) && c.narrow.equal(o.narrow) &&
		slices.Equal(c.silent, o.silent) && slices.EqualFunc(c.creds, o.creds, func(a, b credential) bool {
		return a.name == b.name && a.placeholder == b.placeholder && a.value == b.value && slices.Equal(a.hosts, b.hosts) &&
			a.header == b.header && a.scheme == b.scheme && a.plaintext == b.plaintext && slices.Equal(a.headers, b.headers) &&
			slices.Equal(a.form, b.form) && slices.Equal(a.json, b.json)
	})
}

// caScope is the set of name constraints a CA carries: none (unconstrained), or permitted DNS domains and
// permitted IP ranges, every other IP excluded.
type caScope struct {
	constrained bool
	dns         []string       // sorted, unique
	ips         []netip.Prefix // sorted, unique
	key         string         // a canonical spelling: two scopes are the same when their keys are
}

// scopeOf is the narrowest name constraint that still covers everything the policy allows, where X.509 can
// express it: in allowlist mode, the hosts of its allowing host rules as DNS domains (x, *.x and **.x all
// become x, which X.509 reads as x and every name under it) and its allowing IP and CIDR rules as IP ranges,
// every other IP address excluded. "**" allows every host, and denylist and open mode allow what no rule
// names, so those have no constraint. Mode none allows nothing: its CA may sign only "invalid" (RFC 2606).
// Negated rules narrow what is allowed but cannot narrow the constraint (X.509 exclusions would not follow
// last-match-wins), so they are left out; the proxy refuses what they deny anyway.
func scopeOf(c *policy) caScope {
	var s caScope
	switch c.mode {
	case ModeAllowlist:
	case ModeNone:
		s.constrained, s.dns = true, []string{"invalid"}
		s.key = "dns=invalid"
		return s
	default:
		return s
	}
	for _, r := range c.rules {
		switch {
		case r.Negate:
		case r.Prefix.IsValid():
			s.ips = append(s.ips, r.Prefix)
			if p := r.Prefix; p.Addr().Is6() && p.Bits() <= 96 && p.Contains(netip.MustParseAddr("::ffff:0.0.0.0")) {
				// The matcher lets this prefix cover IPv4 addresses (as IPv4-mapped); X.509 compares IPv4 SANs
				// with IPv4 ranges only.
				s.ips = append(s.ips, netip.MustParsePrefix("0.0.0.0/0"))
			}
		case r.IP.IsValid():
			s.ips = append(s.ips, netip.PrefixFrom(r.IP, r.IP.BitLen()))
		case r.Wildcard == All:
			return caScope{}
		default:
			s.dns = append(s.dns, r.Host)
		}
	}
	s.constrained = true
	if len(s.dns) == 0 {
		s.dns = []string{"invalid"} // an empty list would mean "any name"
	}
	slices.Sort(s.dns)
	s.dns = slices.Compact(s.dns)
	slices.SortFunc(s.ips, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	s.ips = slices.Compact(s.ips)
	var b strings.Builder
	b.WriteString("dns=")
	b.WriteString(strings.Join(s.dns, ","))
	b.WriteString(";ip=")
	for i, p := range s.ips {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(p.String())
	}
	s.key = b.String()
	return s
}

// ipNets is a prefix list as crypto/x509 wants it: IPv4 ranges with 4-byte addresses and masks.
func ipNets(ps []netip.Prefix) []*net.IPNet {
	out := make([]*net.IPNet, 0, len(ps))
	for _, p := range ps {
		out = append(out, &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())})
	}
	return out
}

// SetPolicy checks pol as New does and makes it the proxy's policy. Every request decided after it returns
// uses pol, including a request on a connection opened before (a TLS-inspected connection is decided again
// per request); tunnels already open stay open. When pol changes the CA's name constraints, or turns
// inspection on or off, the CA is replaced (CAGeneration changes). Pooled upstream connections are dropped so
// no later request reuses a connection to an address the new policy refuses. On error the policy is unchanged.
func (p *Proxy) SetPolicy(pol Policy) error {
	c, err := compile(pol)
	if err != nil {
		return err
	}
	p.swap(c, false)
	return nil
}

// swap makes c the policy, replacing the CA when c needs other constraints (unless keepCA: End keeps the CA for
// the next session, which usually has the same policy again), and drops the pools when it changed.
func (p *Proxy) swap(c *policy, keepCA bool) {
	p.caMu.Lock()
	if c.equal(p.pol.Load()) {
		p.caMu.Unlock()
		return // the same policy again: keep decisions and pools
	}
	p.pol.Store(c)
	switch {
	case keepCA:
	case !c.inspect && p.ca != nil:
		p.ca = nil
		p.caGen.Add(1)
	case c.inspect && p.ca != nil && p.ca.scope.key != c.scope.key:
		if err := p.renewCALocked(c.scope); err != nil {
			p.ca = nil // never keep a CA with the old constraints: the next need makes one, or fails
			p.caGen.Add(1)
		}
	}
	p.caMu.Unlock()
	p.transport.CloseIdleConnections()
	p.tlsTransport.CloseIdleConnections()
}

// SetOnBlocked replaces the function told of refusals (nil: none is reported), so a caller can route the
// refusals of each command to that command's run. A request already being decided may still report to the
// previous one.
func (p *Proxy) SetOnBlocked(f func(Block)) {
	if f == nil {
		p.onBlock.Store(nil)
		return
	}
	p.onBlock.Store(&f)
}

// The String and GoString methods below keep %v and %#v from printing a secret, should a credential or a
// policy ever be logged.

// String names the credential without its value.
func (c Credential) String() string { return "credential " + strconv.Quote(c.Name) }

// GoString names the credential without its value.
func (c Credential) GoString() string { return c.String() }

func (c credential) String() string   { return "credential " + strconv.Quote(c.name) }
func (c credential) GoString() string { return c.String() }

func (c *policy) String() string {
	return fmt.Sprintf("egress policy (mode %s, %d credentials)", c.mode, len(c.creds))
}
func (c *policy) GoString() string { return c.String() }

// Inspects reports whether pol decrypts TLS (Inspect on, or auto with credentials): a command under it must
// trust the proxy's CA.
func (pol Policy) Inspects() bool {
	return pol.Inspect == InspectOn || ((pol.Inspect == "" || pol.Inspect == InspectAuto) && len(pol.Credentials) > 0)
}
