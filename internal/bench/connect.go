package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/benchnet"
	"github.com/sandkeep/sandkeep/internal/egress"
)

// ScenarioConnect is the connect scenario's name.
const ScenarioConnect = "connect"

// Sizes of the connect scenario.
const (
	DefaultConnectN     = 400 // blocks; each times one CONNECT through each of the four proxies
	DefaultConnectExecN = 200 // warm `true` samples per side
)

// ConnectBar is issue 12's bar: what the ClientHello check and the per-command token may add to a CONNECT and to
// a warm exec. Reported with the figures, never asserted.
const ConnectBar = 100 * time.Microsecond

// connectHost is the name the target's certificate carries; the bench's resolver answers it with 127.0.0.1.
const connectHost = "bench.test"

// Connect: what the ClientHello check (the SNI peek of every plain tunnel) and the per-command proxy token add,
// side by side in one run. Four proxies, all egress.Proxy as the product makes it, each in a session of its own
// (Begin, as lifecycle starts every command's): one with both on, one without the hello check, one without the
// token (requests neither authenticated nor tied to the session), one without both (egress.ForBench; those
// proxies dial loopback only). One sample is what a client in a sandbox does for an HTTPS request: dial the proxy
// (127.0.0.1, TCP), CONNECT bench.test:port, a TLS 1.3 handshake with the loopback server through the tunnel
// (verified against the run's own CA). Each of n blocks takes one sample of each proxy, the order rotating every
// block. Three rows: both on against both off, and each check on against it off; Extra holds the added cost (the
// difference of the medians and the median of the per-block differences), its noise, and whether it is under
// ConnectBar.
// When e is not nil, a fourth row: a warm `true` through a real sandbox (agent channel) with a network block, so
// that the command is a session of its key's proxy with a token of its own (policy, fresh token, Begin, End),
// against the same with no network block (no session), execN per side in rotating blocks. It is an upper bound
// of the token's share: the whole session costs no more. The hello check is not on an exec's path at all: it
// runs once per tunnel, in the CONNECT rows. What is not in the CONNECT rows: the sandbox's init handing the
// connection to the host's e.sock (the tunnel scenario has it), and the DNS resolution of a real name.
func Connect(ctx context.Context, e *Env, n, execN int) ([]Result, error) {
	rows, err := connectRows(ctx, n)
	if err != nil || e == nil {
		return rows, err
	}
	r, err := connectExec(ctx, e, execN)
	if err != nil {
		return nil, err
	}
	return append(rows, r), nil
}

// connectRows is the CONNECT part of Connect.
func connectRows(ctx context.Context, blocks int) (_ []Result, err error) {
	var wg sync.WaitGroup
	defer wg.Wait()

	cert, roots, err := connectCert()
	if err != nil {
		return nil, err
	}
	srv, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	wg.Go(func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				if c.(*tls.Conn).Handshake() == nil {
					_, _ = io.Copy(io.Discard, c) // until the client closes
				}
			})
		}
	})
	_, port, _ := net.SplitHostPort(srv.Addr().String())
	target := connectHost + ":" + port

	rules, rerrs := egress.ParseRules([]string{connectHost, "127.0.0.1"})
	if rerrs != nil {
		return nil, rerrs[0]
	}
	pol := egress.Policy{Mode: egress.ModeAllowlist, Rules: rules, Inspect: egress.InspectOff}
	// variants[v]: 0 both on (the product), 1 hello check off, 2 token off, 3 both off.
	variants := []egress.BenchOff{{}, {HelloCheck: true}, {Token: true}, {HelloCheck: true, Token: true}}
	addrs := make([]string, len(variants))
	tokens := make([]string, len(variants))
	for v, off := range variants {
		var tok [16]byte
		_, _ = rand.Read(tok[:])
		tokens[v] = hex.EncodeToString(tok[:])
		p, err := egress.New(egress.Config{Policy: egress.Policy{Mode: egress.ModeNone}, Token: tokens[v] + "-before", Resolver: benchnet.Resolver{}})
		if err != nil {
			return nil, err
		}
		if v > 0 {
			egress.ForBench(p, off)
		}
		if err := p.Begin(pol, tokens[v]); err != nil { // a command's session, as lifecycle begins it
			return nil, err
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		wg.Go(func() { _ = p.Serve(l) })
		defer p.Close()
		addrs[v] = l.Addr().String()
	}
	client := &tls.Config{ServerName: connectHost, RootCAs: roots, MinVersion: tls.VersionTLS13}
	once := func(v int) (time.Duration, error) {
		start := time.Now()
		c, err := benchnet.DialConnect(addrs[v], target, tokens[v])
		if err != nil {
			return 0, err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		tc := tls.Client(c, client)
		if err := tc.HandshakeContext(ctx); err != nil {
			return 0, fmt.Errorf("TLS through the tunnel: %w", err)
		}
		d := time.Since(start)
		_ = tc.Close()
		return d, nil
	}
	// Untimed: every proxy's first connection (and the server's first handshake) before the samples.
	for v := range variants {
		if _, err := once(v); err != nil {
			return nil, fmt.Errorf("connect (variant %d): %w", v, err)
		}
	}
	times := make([][]time.Duration, len(variants))
	for block := range blocks {
		for i := range variants {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			v := (i + block) % len(variants) // the order rotates every block
			d, err := once(v)
			if err != nil {
				return nil, fmt.Errorf("connect (variant %d): %w", v, err)
			}
			times[v] = append(times[v], d)
		}
	}
	row := func(name, baseline string, on, off int, what string) Result {
		r := newResult(name, baseline, times[on], times[off])
		diffs := make([]float64, len(times[on]))
		for i := range diffs {
			diffs[i] = float64(times[on][i] - times[off][i])
		}
		r.Extra = addedCost(r.Sandkeep.Median-r.Base.Median, diffs, "CONNECT")
		r.Extra["checks"] = what
		return r
	}
	return []Result{
		row("egress CONNECT + TLS handshake, loopback target (hello check and per-command token on)", "the same proxy with both off", 0, 3, "hello+token"),
		row("egress CONNECT + TLS handshake, loopback target (hello check on)", "the same proxy without the hello check", 0, 1, "hello"),
		row("egress CONNECT + TLS handshake, loopback target (per-command token on)", "the same proxy without the token", 0, 2, "token"),
	}, nil
}

// connectExec is the warm exec row of Connect.
func connectExec(ctx context.Context, e *Env, n int) (_ Result, err error) {
	users := []string{"connect-net", "connect-none"}
	defer func() { err = errors.Join(err, e.removeUsers(ctx, users)) }()
	network := &sandkeep.Network{Mode: "allowlist", Rules: []string{connectHost}, Inherit: "replace"}
	nets := []*sandkeep.Network{network, nil}
	req := sandkeep.ExecRequest{Argv: []string{"true"}}
	series := make([]func(context.Context) error, len(users))
	for i := range users {
		// Untimed: the sandbox, its channel and (for the networked one) its key's proxy.
		if _, err := e.runNet(ctx, e.M, users[i], transportAgent, nets[i], req); err != nil {
			return Result{}, fmt.Errorf("connect warm setup: %w", err)
		}
		series[i] = func(ctx context.Context) error {
			_, err := e.runNet(ctx, e.M, users[i], transportAgent, nets[i], req)
			return err
		}
	}
	s, err := rotate(ctx, n, series...)
	if err != nil {
		return Result{}, fmt.Errorf("connect warm: %w", err)
	}
	r := newResult("warm exec `true` with a network block (a proxy session: policy, per-command token, Begin/End)",
		"the same without a network block (no session)", s[0], s[1])
	diffs := make([]float64, len(s[0]))
	for i := range diffs {
		diffs[i] = float64(s[0][i] - s[1][i]) // samples i of both sides are in the same round of rotate
	}
	r.Extra = addedCost(r.Sandkeep.Median-r.Base.Median, diffs, "exec")
	r.Extra["transport"] = transportAgent
	r.Extra["checks"] = "token (the hello check is per tunnel: none here)"
	return r, nil
}

// addedCost is a row's Extra: the added cost in ms per what (difference of the medians, and the median of the
// paired differences diffs), the bar, the noise (twice the standard error of a median of diffs, from their
// interquartile range), and meets, read on the paired median (both halves of a difference are taken at the same
// moment, so the load's drift cancels): yes when it plus the noise is under the bar, no when minus the noise it is
// over, else undecided (a loaded machine's noise dwarfs a bar of 0.1 ms).
func addedCost(added time.Duration, diffs []float64, what string) map[string]string {
	ms := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
	}
	noise := time.Duration(0)
	if n := len(diffs); n > 1 {
		s := slices.Clone(diffs)
		slices.Sort(s)
		iqr := s[n*3/4] - s[n/4]
		noise = time.Duration(2 * 1.253 * (iqr / 1.349) / math.Sqrt(float64(n)))
	}
	paired := time.Duration(medianFloat(diffs))
	meets := "undecided"
	switch {
	case paired+noise < ConnectBar:
		meets = "yes"
	case paired-noise > ConnectBar:
		meets = "no"
	}
	return map[string]string{
		"added_ms_per_" + what: ms(added),
		"paired_median_ms":     ms(paired),
		"noise_ms":             ms(noise),
		"bar":                  "<" + ms(ConnectBar) + " ms",
		"meets":                meets,
	}
}

// connectCert makes the target's certificate for connectHost, signed by a CA of the run's own, and a pool
// holding that CA.
func connectCert() (tls.Certificate, *x509.CertPool, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sandkeep bench CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: connectHost},
		DNSNames: []string{connectHost}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return tls.Certificate{Certificate: [][]byte{der, caDER}, PrivateKey: key}, pool, nil
}
