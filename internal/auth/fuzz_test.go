package auth

import (
	"slices"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

// FuzzParseScopes: every answer is a fault or a non-empty list of known, distinct scopes that parses back to
// itself.
func FuzzParseScopes(f *testing.F) {
	for _, s := range []string{"", "exec,files", "admin", " Read , EXEC ", "exec,,read", "root", "exec,exec"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseScopes(s)
		if err != nil {
			if !fault.Is(err, fault.InvalidArgument) {
				t.Fatalf("ParseScopes(%q): error %v is not an INVALID_ARGUMENT fault", s, err)
			}
			return
		}
		if len(got) == 0 {
			t.Fatalf("ParseScopes(%q) = no scopes", s)
		}
		for i, sc := range got {
			if !store.ValidScope(sc) || slices.Contains(got[:i], sc) {
				t.Fatalf("ParseScopes(%q) = %q: unknown or repeated scope %q", s, got, sc)
			}
		}
		again, err := ParseScopes(strings.Join(got, ","))
		if err != nil || !slices.Equal(again, got) {
			t.Fatalf("ParseScopes(%q) = %q, which parses back as %q, %v", s, got, again, err)
		}
	})
}

// FuzzParseExpiry: every answer is a fault, "never" (0), or a lifetime within MinExpiry..MaxExpiry.
func FuzzParseExpiry(f *testing.F) {
	for _, s := range []string{"", "never", "30d", "12h", "90m", "1h30m", "3651d", "-1h", "1.5d", "0d", "99999999999d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseExpiry(s)
		switch {
		case err != nil:
			if !fault.Is(err, fault.InvalidArgument) {
				t.Fatalf("ParseExpiry(%q): error %v is not an INVALID_ARGUMENT fault", s, err)
			}
		case d == 0:
			if v := strings.TrimSpace(s); v != "" && !strings.EqualFold(v, "never") {
				t.Fatalf("ParseExpiry(%q) = never", s)
			}
		case d < MinExpiry || d > MaxExpiry:
			t.Fatalf("ParseExpiry(%q) = %v, outside %v..%v", s, d, MinExpiry, MaxExpiry)
		}
	})
}

// FuzzBearer: the header parser accepts only "<bearer> <well-formed token>" and returns the token exactly as it
// appears in the header.
func FuzzBearer(f *testing.F) {
	tok := "skt_" + strings.Repeat("A", 43)
	for _, s := range []string{"", "Bearer " + tok, "bearer\t" + tok, "  BEARER   " + tok + "  ", "Basic " + tok, tok,
		"Bearer " + tok + " x", "Bearer " + tok[:46], "Bearer skt_" + strings.Repeat("é", 20)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		got, ok := bearer(h)
		if !ok {
			if got != "" {
				t.Fatalf("bearer(%q) refused but returned %q", h, got)
			}
			return
		}
		if !wellFormed(got) || len(got) != len(tok) || strings.ContainsAny(got, " \t\r\n") {
			t.Fatalf("bearer(%q) = %q: not a well-formed token", h, got)
		}
		before, ok := strings.CutSuffix(strings.TrimRight(h, " \t"), got)
		if !ok {
			t.Fatalf("bearer(%q) = %q: not the header's last word", h, got)
		}
		if scheme := strings.Trim(before, " \t"); !strings.EqualFold(scheme, "bearer") || before == strings.TrimRight(before, " \t") {
			t.Fatalf("bearer(%q) accepted scheme %q", h, before)
		}
		if again, ok := bearer("Bearer " + got); !ok || again != got {
			t.Fatalf("bearer(Bearer %s) = %q, %v", got, again, ok)
		}
	})
}
