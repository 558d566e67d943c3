package egress

import (
	"bytes"
	"errors"
	"io"
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

// FuzzInjectFields checks that injecting into named body fields never panics, changes nothing but whole-value
// occurrences of the placeholder (undoing the injection gives the body back), and injects into a field only.
func FuzzInjectFields(f *testing.F) {
	for _, s := range []string{
		"", "token=" + fuzzPhA, "a=1&token=" + fuzzPhA + "&b=2", "xtoken=" + fuzzPhA, `{"secret":"` + fuzzPhA + `"}`,
		`{"secret" :  "` + fuzzPhA + `" , "n": {"secret":"` + fuzzPhA + `x"}}`, `"secret":"` + fuzzPhA, fuzzPhA + fuzzPhA,
	} {
		f.Add([]byte(s))
	}
	cr := &credential{placeholder: fuzzPhA, value: fuzzValA, form: []string{"token"}, json: []string{"secret"}}
	f.Fuzz(func(t *testing.T, body []byte) {
		if bytes.Contains(body, []byte(fuzzValA)) {
			t.Skip("the value is already there")
		}
		out := cr.injectFields(body)
		if back := bytes.ReplaceAll(out, []byte(fuzzValA), []byte(fuzzPhA)); !bytes.Equal(back, body) {
			t.Fatalf("injectFields(%q) = %q: more than the placeholder changed", body, out)
		}
		if bytes.Count(out, []byte(fuzzValA)) > bytes.Count(body, []byte(fuzzPhA)) {
			t.Fatalf("more values than placeholders: %q", out)
		}
		if !bytes.Contains(body, []byte("token=")) && !bytes.Contains(body, []byte(`"secret"`)) && !bytes.Equal(out, body) {
			t.Fatalf("injected without a named field: %q -> %q", body, out)
		}
	})
}

// FuzzScrubReader checks that the streaming scrubber gives what replacing every form in the whole body at once
// gives, whatever the body and the read size.
func FuzzScrubReader(f *testing.F) {
	f.Add([]byte("xx "+fuzzValA+" yy"), uint16(1))
	f.Add([]byte(fuzzValA[:5]), uint16(3))
	f.Add(bytes.Repeat([]byte(fuzzValA+"dmFsdWU"), 40), uint16(17))
	reps := []replacement{{fuzzValA, fuzzPhA, "A"}, {"dmFsdWU", "UExBQ0U", "A"}}
	f.Fuzz(func(t *testing.T, body []byte, size uint16) {
		n := int(size%4096) + 1
		got, err := io.ReadAll(newScrubReader(io.NopCloser(&chunked{s: string(body), n: n}), reps, nil))
		if err != nil {
			t.Fatal(err)
		}
		want := string(body)
		// The forms share no bytes at their ends, so replacing them one after the other is the same as scanning once.
		for _, r := range reps {
			want = strings.ReplaceAll(want, r.from, r.to)
		}
		if string(got) != want {
			t.Fatalf("scrubbed %q in reads of %d: %q, want %q", body, n, got, want)
		}
	})
}
