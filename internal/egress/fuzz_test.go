package egress

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseRule checks that ParseRule never panics, refuses only with a coded *RuleError, and that an
// accepted rule round-trips through its canonical String.
func FuzzParseRule(f *testing.F) {
	for _, s := range []string{
		"", "!", "**", "*", "**.github.com", "!gist.github.com", "*.npmjs.org:443", "a.*.b", "*x.com",
		"10.0.0.0/8", "10.0.0.1/8", "[2001:db8::/32]:443", "::ffff:0:0/96", "[::ffff:a9fe:a9fe]:80",
		"0x7f.1", "2130706433", "*.1.2.3.4", "bücher.de", "xn--zz", "a.com:0", "[::1", "!!x", "１２７.０.０.１",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			var re *RuleError
			if !errors.As(err, &re) || !strings.HasPrefix(string(re.Code), "SK3") || re.Message == "" || re.Hint == "" {
				t.Fatalf("ParseRule(%q): error %#v is not a coded *RuleError", s, err)
			}
			return
		}
		checkRoundTrip(t, s, r)
	})
}

// FuzzNormalizeHost checks that NormalizeHost never panics, refuses only with a coded *RuleError, and is
// idempotent, returning either a valid DNS name or an IP whose String is the host.
func FuzzNormalizeHost(f *testing.F) {
	for _, s := range []string{
		"", ".", "Example.COM.", "example.com:443", "127.1", "0x7f.1", "0177.0.0.1", "2130706433",
		"[::ffff:a9fe:a9fe]", "::1", "[fe80::1%eth0]", "bücher.de", "a.1", "1.2.3.4.5", "0x", "xn--bcher-kva.de",
		"straße.de", "example.com。", "[::1]:80", "4294967296",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkNormalized(t, s)
	})
}
