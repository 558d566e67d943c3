package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// The ephemeral CA's life. It is renewed by CACert once less than caRenewBefore remains, so a caller that
// calls CACert before each command hands the sandbox a CA that outlives the command by hours; the
// inspection path itself renews it only at the very end (caLastMinute), because a CA replaced mid-command is
// one the command's clients do not trust yet.
const (
	caValidity    = 24 * time.Hour
	caBackdate    = 5 * time.Minute // tolerates a sandbox clock a little behind the host's
	caRenewBefore = 6 * time.Hour
	caLastMinute  = time.Minute
	maxLeaves     = 256 // leaf certificates kept per CA; the least recently used goes first
)

// authority is one ephemeral CA: its private key lives only in this struct (never on disk), and it signs the
// leaf certificates the proxy presents to the sandbox for the hosts it inspects.
type authority struct {
	scope   caScope
	cert    *x509.Certificate
	der     []byte
	pem     []byte
	key     *ecdsa.PrivateKey
	leafKey *ecdsa.PrivateKey // one key for every leaf of this CA: it never leaves the proxy either

	mu     sync.Mutex       // guards leaves and clock
	leaves map[string]*leaf // by normalised host; at most maxLeaves
	clock  uint64           // counts leaf uses, to find the least recently used
}

type leaf struct {
	cert *tls.Certificate
	used uint64
}

// serial is a random 128-bit certificate serial number.
func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}

// newAuthority makes a CA (ECDSA P-256) valid from now-caBackdate for caValidity, constrained to scope.
func newAuthority(scope caScope, now time.Time) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress CA key: %w", err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress CA leaf key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, fmt.Errorf("egress CA serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject: pkix.Name{
			Organization: []string{"sandkeep"},
			CommonName:   "sandkeep egress CA " + hex.EncodeToString(sn.Bytes()[:4]),
		},
		NotBefore:             now.Add(-caBackdate),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true, // signs leaves only, never another CA
	}
	if scope.constrained {
		tmpl.PermittedDNSDomainsCritical = true
		tmpl.PermittedDNSDomains = scope.dns
		if len(scope.ips) > 0 {
			tmpl.PermittedIPRanges = ipNets(scope.ips)
		} else { // no permitted range would mean every address: exclude them all instead
			tmpl.ExcludedIPRanges = ipNets([]netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")})
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("egress CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("egress CA certificate: %w", err)
	}
	return &authority{
		scope:   scope,
		cert:    cert,
		der:     der,
		pem:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:     key,
		leafKey: leafKey,
		leaves:  make(map[string]*leaf),
	}, nil
}

// leafFor returns the certificate (leaf and CA) the proxy presents for host, a normalised name or IP.
func (a *authority) leafFor(host string) (*tls.Certificate, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.clock++
	if l, ok := a.leaves[host]; ok {
		l.used = a.clock
		return l.cert, nil
	}
	sn, err := serial()
	if err != nil {
		return nil, fmt.Errorf("egress leaf serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: host},
		NotBefore:             a.cert.NotBefore,
		NotAfter:              a.cert.NotAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = []net.IP{ip.AsSlice()}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &a.leafKey.PublicKey, a.key)
	if err != nil {
		return nil, fmt.Errorf("egress leaf certificate for %s: %w", host, err)
	}
	if len(a.leaves) >= maxLeaves {
		oldest, min := "", uint64(0)
		for h, l := range a.leaves {
			if oldest == "" || l.used < min {
				oldest, min = h, l.used
			}
		}
		delete(a.leaves, oldest)
	}
	c := &tls.Certificate{Certificate: [][]byte{der, a.der}, PrivateKey: a.leafKey}
	a.leaves[host] = &leaf{cert: c, used: a.clock}
	return c, nil
}

// currentCA returns the CA for the current policy and its generation, making the CA when there is none, when
// the policy's constraints changed, or when less than renewBefore of its validity remains; nil when
// inspection is off. The policy is read under caMu, where SetPolicy stores it, so a CA is never made for a
// stale policy.
func (p *Proxy) currentCA(renewBefore time.Duration) (*authority, uint64, error) {
	p.caMu.Lock()
	defer p.caMu.Unlock()
	pol := p.pol.Load()
	if !pol.inspect {
		return nil, p.caGen.Load(), nil
	}
	a := p.ca
	if a == nil || a.scope.key != pol.scope.key || !time.Now().Add(renewBefore).Before(a.cert.NotAfter) {
		if err := p.renewCALocked(pol.scope); err != nil {
			return nil, p.caGen.Load(), err
		}
		a = p.ca
	}
	return a, p.caGen.Load(), nil
}

// renewCALocked replaces the CA with a new one for scope; the caller holds caMu.
func (p *Proxy) renewCALocked(scope caScope) error {
	a, err := newAuthority(scope, time.Now())
	if err != nil {
		return err
	}
	p.ca = a
	p.caGen.Add(1)
	return nil
}

// CACert returns the PEM certificate of the CA the sandbox must trust for TLS inspection, making the CA on
// first use and renewing it when less than six of its 24 hours remain; nil when inspection is off (or when no
// key could be generated, which does not happen in practice). Call it before each command and rewrite the
// sandbox's bundle when CAGeneration changed, or use CA, which returns both together.
func (p *Proxy) CACert() []byte {
	pem, _ := p.CA()
	return pem
}

// CAGeneration counts CA changes: it changes whenever the CA that CACert returns does (made, renewed,
// replaced for new name constraints, dropped when inspection is turned off). It is 0 until the first CA.
func (p *Proxy) CAGeneration() uint64 {
	return p.caGen.Load()
}

// CA is CACert and CAGeneration read together: generation is the one of the certificate returned.
func (p *Proxy) CA() (pem []byte, generation uint64) {
	a, gen, err := p.currentCA(caRenewBefore)
	if err != nil || a == nil {
		return nil, gen
	}
	return slices.Clone(a.pem), gen
}
