package egress

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"
)

func parseCA(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	blk, rest := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) != 0 {
		t.Fatalf("CACert is not one PEM certificate: %q", b)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func netStrings(ns []*net.IPNet) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.String())
	}
	return out
}

// TestCAConstraints: the CA is an ECDSA P-256 CA for about a day that signs leaves only, name-constrained to
// what an allowlist allows when X.509 can say it, and unconstrained otherwise.
func TestCAConstraints(t *testing.T) {
	allIPs := []string{"0.0.0.0/0", "::/0"}
	tests := []struct {
		name     string
		mode     string
		rules    []string
		dns      []string // nil: unconstrained
		ips      []string // permitted
		excluded []string
	}{
		{name: "hosts", mode: ModeAllowlist, rules: []string{"api.example.com", "*.npmjs.org", "**.github.com", "!gist.github.com", "api.example.com:443"},
			dns: []string{"api.example.com", "github.com", "npmjs.org"}, excluded: allIPs},
		{name: "hosts and IPs", mode: ModeAllowlist, rules: []string{"api.test", "10.1.0.0/16", "[2001:db8::/32]:443", "127.0.0.1"},
			dns: []string{"api.test"}, ips: []string{"10.1.0.0/16", "127.0.0.1/32", "2001:db8::/32"}},
		{name: "v6 prefix covering mapped v4", mode: ModeAllowlist, rules: []string{"api.test", "::/0"},
			dns: []string{"api.test"}, ips: []string{"0.0.0.0/0", "::/0"}},
		{name: "IPs only", mode: ModeAllowlist, rules: []string{"10.0.0.0/8"}, dns: []string{"invalid"}, ips: []string{"10.0.0.0/8"}},
		{name: "nothing allowed", mode: ModeAllowlist, rules: []string{"!x.test"}, dns: []string{"invalid"}, excluded: allIPs},
		{name: "mode none", mode: ModeNone, dns: []string{"invalid"}, excluded: allIPs},
		{name: "**", mode: ModeAllowlist, rules: []string{"api.test", "**"}},
		{name: "denylist", mode: ModeDenylist, rules: []string{"!x.test"}},
		{name: "open", mode: ModeOpen},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{Policy: Policy{Mode: tt.mode, Rules: rules(t, tt.rules...), Inspect: InspectOn}, Token: testToken})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if p.CAGeneration() != 0 {
				t.Error("a CA before it was needed")
			}
			ca := parseCA(t, p.CACert())
			if p.CAGeneration() != 1 {
				t.Errorf("generation %d after the first CACert, want 1", p.CAGeneration())
			}
			if !ca.IsCA || !ca.BasicConstraintsValid || ca.MaxPathLen != 0 || !ca.MaxPathLenZero || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
				t.Errorf("not a leaf-only CA: IsCA %v MaxPathLen %d", ca.IsCA, ca.MaxPathLen)
			}
			if k, ok := ca.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
				t.Errorf("key %T, want ECDSA P-256", ca.PublicKey)
			}
			if life := ca.NotAfter.Sub(ca.NotBefore); life < 24*time.Hour || life > 25*time.Hour || !ca.NotBefore.Before(time.Now()) {
				t.Errorf("valid %v .. %v", ca.NotBefore, ca.NotAfter)
			}
			if fmt.Sprint(ca.PermittedDNSDomains) != fmt.Sprint(tt.dns) || fmt.Sprint(netStrings(ca.PermittedIPRanges)) != fmt.Sprint(tt.ips) ||
				fmt.Sprint(netStrings(ca.ExcludedIPRanges)) != fmt.Sprint(tt.excluded) {
				t.Errorf("constraints dns %v ip %v excluded %v, want %v %v %v", ca.PermittedDNSDomains,
					netStrings(ca.PermittedIPRanges), netStrings(ca.ExcludedIPRanges), tt.dns, tt.ips, tt.excluded)
			}
			if ca.PermittedDNSDomainsCritical != (tt.dns != nil) {
				t.Errorf("constraints critical: %v", ca.PermittedDNSDomainsCritical)
			}
		})
	}
}

// TestCAConstraintsHold: a leaf the CA would sign for a host outside its constraints does not verify, so the
// CA cannot vouch for anything the allowlist does not allow even if its key were misused.
func TestCAConstraintsHold(t *testing.T) {
	p, err := New(Config{Policy: Policy{Mode: ModeAllowlist, Rules: rules(t, "**.example.com", "10.0.0.0/8"), Inspect: InspectOn}, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(p.CACert())
	a, _, err := p.currentCA(caLastMinute)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		host string
		ok   bool
	}{{"example.com", true}, {"a.b.example.com", true}, {"10.2.3.4", true}, {"evil.test", false}, {"example.com.evil.test", false}, {"8.8.8.8", false}, {"2001:db8::1", false}} {
		c, err := a.leafFor(tt.host)
		if err != nil {
			t.Fatal(err)
		}
		leaf, _ := x509.ParseCertificate(c.Certificate[0])
		_, err = leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: tt.host})
		if (err == nil) != tt.ok {
			t.Errorf("%s: verify error %v, want ok=%v", tt.host, err, tt.ok)
		}
	}
}

// TestCARegenerated: the CA is replaced (and its generation changes) when the constraints change or
// inspection is turned off and on, and kept when a new policy has the same constraints.
func TestCARegenerated(t *testing.T) {
	pol := func(inspect string, rs ...string) Policy {
		return Policy{Mode: ModeAllowlist, Rules: rules(t, rs...), Inspect: inspect}
	}
	p, err := New(Config{Policy: pol(InspectOn, "a.test", "b.test"), Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	first := p.CACert()
	steps := []struct {
		name    string
		pol     Policy
		changed bool
		nilCA   bool
	}{
		{"same rules, other order", pol(InspectOn, "b.test", "a.test"), false, false},
		{"a negation added", pol(InspectOn, "b.test", "a.test", "!x.a.test"), false, false},
		{"a port added", pol(InspectOn, "b.test:443", "a.test"), false, false},
		{"a host added", pol(InspectOn, "a.test", "b.test", "c.test"), true, false},
		{"inspection off", pol(InspectOff, "a.test", "b.test", "c.test"), true, true},
		{"inspection on again", pol(InspectOn, "a.test", "b.test", "c.test"), true, false},
		{"open mode", Policy{Mode: ModeOpen, Inspect: InspectOn}, true, false},
	}
	prev, gen := first, p.CAGeneration()
	for _, s := range steps {
		if err := p.SetPolicy(s.pol); err != nil {
			t.Fatal(err)
		}
		ca, g := p.CA()
		if (g != gen) != s.changed || (!bytes.Equal(ca, prev)) != s.changed || (ca == nil) != s.nilCA {
			t.Errorf("%s: generation %d -> %d, CA changed %v (nil %v); want changed %v, nil %v", s.name, gen, g, !bytes.Equal(ca, prev), ca == nil, s.changed, s.nilCA)
		}
		if g != p.CAGeneration() {
			t.Errorf("%s: CA returned generation %d, CAGeneration %d", s.name, g, p.CAGeneration())
		}
		prev, gen = ca, g
	}
}

// TestCARenewal: CACert renews a CA with less than caRenewBefore left; the inspection path does not until the
// last minute, so a CA is not replaced under a running command's clients.
func TestCARenewal(t *testing.T) {
	p, err := New(Config{Policy: Policy{Mode: ModeOpen, Inspect: InspectOn}, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.CACert()
	old, err := newAuthority(p.pol.Load().scope, time.Now().Add(-20*time.Hour)) // 4h left
	if err != nil {
		t.Fatal(err)
	}
	p.caMu.Lock()
	p.ca = old
	p.caMu.Unlock()
	gen := p.CAGeneration()
	if a, _, _ := p.currentCA(caLastMinute); a != old {
		t.Error("the inspection path renewed a CA with hours left")
	}
	if ca := parseCA(t, p.CACert()); !ca.NotAfter.After(time.Now().Add(23*time.Hour)) || p.CAGeneration() == gen {
		t.Errorf("CACert kept a CA with 4h left (until %v, generation %d)", ca.NotAfter, p.CAGeneration())
	}
}

// TestLeafCache: a host's leaf is made once and reused; the cache stays bounded.
func TestLeafCache(t *testing.T) {
	a, err := newAuthority(caScope{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	first, _ := a.leafFor("keep.test")
	for i := range maxLeaves + 10 {
		if _, err := a.leafFor("h" + strconv.Itoa(i) + ".test"); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if again, _ := a.leafFor("keep.test"); again != first {
				t.Fatal("a recently used leaf was evicted")
			}
		}
	}
	if n := len(a.leaves); n > maxLeaves {
		t.Errorf("%d leaves cached, over %d", n, maxLeaves)
	}
	leaf, _ := x509.ParseCertificate(first.Certificate[0])
	if !slices.Equal(leaf.DNSNames, []string{"keep.test"}) || !leaf.NotAfter.Equal(a.cert.NotAfter) || leaf.IsCA {
		t.Errorf("leaf %v until %v", leaf.DNSNames, leaf.NotAfter)
	}
}
