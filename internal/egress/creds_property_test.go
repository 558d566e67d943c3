package egress

import (
	"bytes"
	"encoding/base64"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// The fixed credentials of the credential properties and fuzz target. Values are lower case and placeholders
// upper case, and filler text is drawn from neither alphabet, so no needle appears unless one is put there.
const (
	fuzzPhA  = "SANDKEEP_CRED_A_0123456789ABCDEF0123456789ABCDEF"
	fuzzPhB  = "SANDKEEP_CRED_B_FEDCBA9876543210FEDCBA9876543210"
	fuzzValA = "value-of-a-1234"
	fuzzValB = "value-of-b-5678"
)

// credTestPolicy: A may go to a.test, B to b.test.
func credTestPolicy(t testing.TB) *policy {
	ra, _ := ParseRule("a.test")
	rb, _ := ParseRule("b.test")
	c, err := compile(Policy{Mode: ModeOpen, Credentials: []Credential{
		{Name: "A", Placeholder: fuzzPhA, Value: fuzzValA, Hosts: []Rule{ra}},
		{Name: "B", Placeholder: fuzzPhB, Value: fuzzValB, Hosts: []Rule{rb}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// forwarded is what apply lets out of r: its URL, header values (Basic credentials decoded) and body.
func forwarded(t interface{ Fatalf(string, ...any) }, r *http.Request) string {
	var b strings.Builder
	b.WriteString(r.URL.String())
	for k, vs := range r.Header {
		b.WriteString(k)
		for _, v := range vs {
			b.WriteString("\n" + v)
			if dec, ok := decodeBasic(v); ok {
				b.WriteString("\n" + dec)
			}
		}
	}
	if r.Body != nil {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Fatalf("read body: %v", err)
		}
		if r.ContentLength >= 0 && int64(len(body)) != r.ContentLength {
			t.Fatalf("ContentLength %d, body %d bytes", r.ContentLength, len(body))
		}
		b.WriteString("\n")
		b.Write(body)
	}
	return b.String()
}

// TestCredentialProperties: for any request carrying any mix of the two credentials' placeholders and
// values (in headers, Basic credentials, the query, the body) to either host, apply refuses exactly when
// something of the other credential is there, and otherwise forwards the host's own credential's value only in
// place of "Bearer <placeholder>" in Authorization, and nothing of the other.
func TestCredentialProperties(t *testing.T) {
	pol := credTestPolicy(t)
	rapid.Check(t, func(t *rapid.T) {
		toA := rapid.Bool().Draw(t, "toA")
		host := "b.test"
		own, ownVal, other, otherVal := fuzzPhB, fuzzValB, fuzzPhA, fuzzValA
		if toA {
			host = "a.test"
			own, ownVal, other, otherVal = fuzzPhA, fuzzValA, fuzzPhB, fuzzValB
		}
		filler := rapid.StringMatching(`[XYZ .:/=+{}"]{0,12}`)
		needles := []string{"", own, ownVal, other, otherVal}
		piece := func(label string) (string, int) {
			i := rapid.IntRange(0, len(needles)-1).Draw(t, label+"-needle")
			return filler.Draw(t, label+"-pre") + needles[i] + filler.Draw(t, label+"-post"), i
		}
		leaky := false
		note := func(i int) { leaky = leaky || i >= 3 }
		hv, i := piece("header")
		note(i)
		basic, j := piece("basic")
		note(j)
		query, k := piece("query")
		note(k)
		body, l := piece("body")
		note(l)
		r, err := http.NewRequest(http.MethodPost, "http://"+host+"/p?q="+url.QueryEscape(query), strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("X-Token", hv)
		bearer := rapid.Bool().Draw(t, "bearer")
		if bearer { // what the definition (Authorization, Bearer) says: injected
			basic = ""
			leaky = i >= 3 || k >= 3 || l >= 3
			r.Header.Set("Authorization", "Bearer "+own)
		} else {
			r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("user:"+basic)))
		}
		plan := pol.planFor(host, netip.Addr{}, false, 80, true)
		leak, err := plan.apply(r)
		if err != nil {
			t.Fatal(err)
		}
		if (leak != "") != leaky {
			t.Fatalf("leak %q, want a leak: %v", leak, leaky)
		}
		if leaky {
			return
		}
		out := forwarded(t, r)
		if strings.Contains(out, other) || strings.Contains(out, otherVal) {
			t.Fatalf("forwarded the other credential: %q", out)
		}
		// The value goes only where the definition says (Authorization: Bearer <placeholder>); every other
		// placeholder is forwarded as it is, and the value only where the sandbox itself wrote it.
		sent := hv + "\n" + basic + "\n" + query + "\n" + body
		if got, want := strings.Count(out, ownVal), strings.Count(sent, ownVal)+btoi(bearer); got != want {
			t.Fatalf("%d values forwarded, want %d: %q", got, want, out)
		}
		if got, want := strings.Count(out, own), strings.Count(sent, own); got != want {
			t.Fatalf("%d placeholders forwarded, want %d (those outside Authorization): %q", got, want, out)
		}
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// FuzzCredentialApply: for any Authorization value and body to a.test (may get A) or elsewhere (may get
// neither), apply never panics, and when it does not refuse, nothing of a credential the host may not get
// is forwarded, and Authorization changes exactly when it is "Bearer <A's placeholder>" to a.test.
func FuzzCredentialApply(f *testing.F) {
	f.Add("Bearer "+fuzzPhA, []byte(`{"k":"`+fuzzPhA+`"}`), true)
	f.Add("Basic "+base64.StdEncoding.EncodeToString([]byte("u:"+fuzzPhA)), []byte(nil), true)
	f.Add("Bearer "+fuzzValB, []byte("x"), false)
	f.Add("basic  "+base64.StdEncoding.EncodeToString([]byte(fuzzPhB)), []byte(fuzzPhA+fuzzPhA), false)
	pol := credTestPolicy(f)
	f.Fuzz(func(t *testing.T, auth string, body []byte, toA bool) {
		if len(body) > bodyScanLimit {
			t.Skip("past the scanned bound, by design")
		}
		host := "c.test"
		if toA {
			host = "a.test"
		}
		r, err := http.NewRequest(http.MethodPut, "http://"+host+"/", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		r.Header["Authorization"] = []string{auth}
		plan := pol.planFor(host, netip.Addr{}, false, 80, true)
		leak, err := plan.apply(r)
		if err != nil {
			t.Fatal(err)
		}
		if leak != "" {
			return
		}
		out := forwarded(t, r)
		forbidden := []string{fuzzPhB, fuzzValB}
		if !toA {
			forbidden = append(forbidden, fuzzPhA, fuzzValA)
		}
		for _, s := range forbidden {
			if strings.Contains(out, s) {
				t.Fatalf("forwarded %q to %s: %q", s, host, out)
			}
		}
		a := r.Header.Get("Authorization")
		scheme, rest, _ := strings.Cut(strings.TrimSpace(auth), " ")
		if toA && strings.EqualFold(scheme, "Bearer") && strings.TrimSpace(rest) == fuzzPhA {
			if a != "Bearer "+fuzzValA {
				t.Fatalf("Authorization %q became %q, want the value", auth, a)
			}
		} else if a != auth {
			t.Fatalf("Authorization %q became %q, which the definition does not say", auth, a)
		}
	})
}
