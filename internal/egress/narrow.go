package egress

// A caller's network block (an API token's, an MCP session's) narrows its template's policy and never widens
// it: Narrow keeps the template's policy whole (its mode and rules, its silent list, its inspection and
// credentials; the proxy's refused address classes are the proxy's) and adds the caller's rules as a second
// test every request must also pass. Comparing rule strings instead would let the caller drop the template's
// negations, lose its inspection, or unlock loopback with an IP rule of its own.

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// Narrowing is a caller's rules as the proxy applies them on top of a Policy (Policy.Narrow): a request the
// policy allows is refused unless the narrowing allows it too, and a refused address class needs an IP or
// CIDR rule of both to be unlocked.
type Narrowing struct {
	Mode  string // none or allowlist
	Rules []Rule // last match wins
}

// narrowing is a Narrowing compiled.
type narrowing struct {
	mode    string
	rules   []Rule
	ipRules []Rule
}

// Narrow returns base narrowed by a caller's policy: a request passes only when base and the caller's both
// allow it. The caller may ask for mode none (the result is mode none), or an allowlist of rules without
// credentials, inspection setting or silent list of its own; an allowing IP or CIDR rule must be one of
// base's own allowing rules (it would unlock an address class base keeps refused), and an allowing host rule
// must name hosts base allows (a rule of base's, a host base's rules allow, or a name under a "**" rule of
// base's), so a request for more is refused rather than quietly allowing nothing. The error is a
// *fault.Error, NetworkWidened.
func Narrow(base, caller Policy) (Policy, error) {
	widen := func(format string, args ...any) error {
		return fault.New(fault.NetworkWidened, "ask for a subset of the template's hosts, or network mode none",
			"a caller's network block may only narrow the template's, and "+format, args...)
	}
	switch caller.Mode {
	case "", ModeNone:
		return Policy{Mode: ModeNone, Silent: slices.Clone(base.Silent)}, nil
	case ModeAllowlist:
	default:
		return Policy{}, widen("mode %s is wider than an allowlist", cut(caller.Mode))
	}
	switch {
	case len(caller.Credentials) > 0:
		return Policy{}, widen("credentials are the operator's")
	case caller.Inspect != "" && caller.Inspect != base.Inspect:
		return Policy{}, widen("TLS inspection is the template's")
	case base.Mode == "" || base.Mode == ModeNone:
		return Policy{}, widen("the template allows no network")
	case base.Narrow != nil:
		return Policy{}, widen("the template's policy is already narrowed")
	}
	for _, r := range caller.Rules {
		if r.Negate || covers(base, r) {
			continue
		}
		return Policy{}, widen("rule %s is not within the template's", r.String())
	}
	out := base
	out.Rules = slices.Clone(base.Rules)
	out.Silent = slices.Clone(base.Silent)
	out.Credentials = slices.Clone(base.Credentials)
	out.Narrow = &Narrowing{Mode: ModeAllowlist, Rules: slices.Clone(caller.Rules)}
	return out, nil
}

// covers reports whether base allows what the allowing rule r names, as far as admission can tell without
// resolving anything: the request-time check is the intersection itself.
func covers(base Policy, r Rule) bool {
	if slices.ContainsFunc(base.Rules, func(b Rule) bool { return !b.Negate && b == r }) {
		return true
	}
	if r.IP.IsValid() || r.Prefix.IsValid() {
		return false // an address rule unlocks address classes: only the template's own may
	}
	if base.Mode != ModeAllowlist {
		return true // denylist and open allow every name their rules do not deny; the intersection keeps the denials
	}
	if r.Wildcard == Exact {
		if _, ok := match(base.Rules, r.Host, r.IP, false, r.Port); ok {
			return true
		}
	}
	for _, b := range base.Rules {
		if b.Negate || (b.Port != 0 && b.Port != r.Port) || b.IP.IsValid() || b.Prefix.IsValid() {
			continue
		}
		switch {
		case b.Wildcard == All:
			return true
		case b.Wildcard == AnyDepth && r.Wildcard != All && (r.Host == b.Host || strings.HasSuffix(r.Host, "."+b.Host)):
			return true
		}
	}
	return false
}

// compileNarrowing checks and compiles a Policy's Narrow; nil is none.
func compileNarrowing(n *Narrowing) (*narrowing, error) {
	if n == nil {
		return nil, nil
	}
	c := &narrowing{mode: n.Mode, rules: slices.Clone(n.Rules)}
	switch c.mode {
	case "", ModeNone:
		c.mode = ModeNone
	case ModeAllowlist:
	default:
		return nil, fault.New(fault.NetworkInvalid, "narrow with none or an allowlist", "the narrowing mode %q is unknown", cut(n.Mode))
	}
	for _, r := range c.rules {
		if r.IP.IsValid() || r.Prefix.IsValid() {
			c.ipRules = append(c.ipRules, r)
		}
	}
	return c, nil
}

// equal reports whether n and o are the same narrowing (nil is none).
func (n *narrowing) equal(o *narrowing) bool {
	if n == nil || o == nil {
		return n == o
	}
	return n.mode == o.mode && slices.Equal(n.rules, o.rules)
}

// denies applies n to a name or address before anything is resolved: the refusal's reason and rule, or "".
func (n *narrowing) denies(name string, ip netip.Addr, isIP bool, port uint16) (reason, rule string) {
	if n == nil {
		return "", ""
	}
	if n.mode == ModeNone {
		return ReasonModeNone, ""
	}
	switch r, ok := match(n.rules, name, ip, isIP, port); {
	case r != nil && !ok:
		return ReasonRule, r.String()
	case r == nil:
		return ReasonUnlisted, ""
	}
	return "", ""
}
