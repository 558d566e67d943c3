package egress

import (
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// A value with bytes that percent-encoding changes, so the escaped form differs from the literal one.
const reflectValue = "sk/live+SENTINEL=9c41d7e2"

// reflector is an upstream that hands back everything it got: each request header in a response header
// X-Got-<name> (literal) and X-Got-Esc-<name> (percent-encoded), and, in the body after padding that puts it past
// the scrubber's first read, the headers again literal, percent-encoded and base64-encoded, then the request body.
type reflector struct {
	*httptest.Server
	mu   sync.Mutex
	seen []http.Header
	body []string
}

func newReflector(t *testing.T, tlsOn bool) *reflector {
	rf := &reflector{}
	rf.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rf.mu.Lock()
		rf.seen = append(rf.seen, r.Header.Clone())
		rf.body = append(rf.body, string(b))
		rf.mu.Unlock()
		for k, vs := range r.Header {
			w.Header().Set("X-Got-"+k, vs[0])
			w.Header().Set("X-Got-Esc-"+k, url.QueryEscape(vs[0]))
		}
		_, _ = io.WriteString(w, strings.Repeat(".", scrubChunk-7)) // an occurrence straddles the first read
		for k, vs := range r.Header {
			tok := vs[0]
			if _, rest, ok := strings.Cut(vs[0], " "); ok {
				tok = rest
			}
			fmt.Fprintf(w, "\n%s: %s | %s | %s | %s", k, vs[0], url.QueryEscape(vs[0]), url.PathEscape(tok),
				base64.StdEncoding.EncodeToString([]byte(tok)))
		}
		fmt.Fprintf(w, "\nbody: %s\n", b)
	}))
	if tlsOn {
		rf.EnableHTTP2 = true
		rf.TLS = &tls.Config{Certificates: []tls.Certificate{testPKI(t).cert}}
		rf.StartTLS()
	} else {
		rf.Start()
	}
	t.Cleanup(rf.Close)
	return rf
}

func (rf *reflector) last() (http.Header, string) {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	if len(rf.seen) == 0 {
		return nil, ""
	}
	return rf.seen[len(rf.seen)-1], rf.body[len(rf.body)-1]
}

// reflectHarness is an inspecting proxy with credential cr (its Placeholder and Value filled in) for api.test,
// which resolves to a reflector (TLS and plain), and the reflections the proxy reported.
type reflectHarness struct {
	*harness
	cr          Credential
	tls, plain  *reflector
	mu          sync.Mutex
	reflections []Reflection
}

func newReflectHarness(t *testing.T, cr Credential) *reflectHarness {
	rh := &reflectHarness{tls: newReflector(t, true), plain: newReflector(t, false)}
	cr.Name, cr.Placeholder, cr.Value, cr.Hosts = "API_KEY", NewPlaceholder("API_KEY"), reflectValue, rules(t, "api.test")
	rh.cr = cr
	rec := newRecorder(t, map[string][]string{"api.test": {"192.88.99.10"}})
	rh.harness = newInspectHarness(t, Policy{Mode: ModeAllowlist, Rules: rules(t, "api.test"), Credentials: []Credential{cr}}, rec)
	rh.p.SetOnReflected(func(r Reflection) {
		rh.mu.Lock()
		rh.reflections = append(rh.reflections, r)
		rh.mu.Unlock()
	})
	return rh
}

func (rh *reflectHarness) reflected() []Reflection {
	rh.mu.Lock()
	defer rh.mu.Unlock()
	return append([]Reflection(nil), rh.reflections...)
}

// send sends a request to api.test over https (h2 or not) or plain http, with the headers and body given, and
// returns the status, the refusal reason and everything the sandbox got back (headers and body as one string).
func (rh *reflectHarness) send(scheme string, h2 bool, header map[string]string, body string) (int, string, string) {
	rh.t.Helper()
	rf := rh.tls
	if scheme == "http" {
		rf = rh.plain
	}
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(http.MethodPost, scheme+"://api.test:"+portOf(rf.Server)+"/echo", rd)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := rh.client(proxyRoots(rh.t, rh.p), h2 && scheme == "https").Do(req)
	if err != nil {
		rh.t.Fatal(err)
	}
	got := readAll(rh.t, resp)
	return resp.StatusCode, resp.Header.Get(DeniedHeader), fmt.Sprint(resp.Header) + "\n" + got
}

func portOf(s *httptest.Server) string {
	_, p, _ := strings.Cut(s.Listener.Addr().String(), "127.0.0.1:")
	return p
}

// forms are the forms of the value a reflection could carry it in.
func forms(v string) []string {
	out := []string{v, url.QueryEscape(v), url.PathEscape(v)}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		out = append(out, enc.EncodeToString([]byte(v)))
	}
	return out
}

func checkNoValue(t *testing.T, what, got string, extra ...string) {
	t.Helper()
	for _, f := range append(forms(reflectValue), extra...) {
		if strings.Contains(got, f) {
			t.Errorf("%s: the sandbox got the value back as %q", what, f)
		}
	}
}

// TestCredentialReflected: every read-back path a reflecting endpoint offers is closed. The value reaches the
// upstream in Authorization only; the reflected header, the reflected body (literal, percent- and base64-
// encoded, across the scrubber's reads) and the placeholder put elsewhere come back as the placeholder's forms,
// never as the value's, over HTTP/1.1 and HTTP/2; each scrub is reported once per place.
func TestCredentialReflected(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			rh := newReflectHarness(t, Credential{})
			ph := rh.cr.Placeholder
			status, _, got := rh.send("https", h2, map[string]string{
				"Authorization": "Bearer " + ph,
				"X-Other":       ph, // another header: not injected
			}, `{"comment":"`+ph+`"}`) // the body: not injected
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, got)
			}
			hdr, body := rh.tls.last()
			if hdr.Get("Authorization") != "Bearer "+reflectValue || hdr.Get("X-Other") != ph || body != `{"comment":"`+ph+`"}` {
				t.Errorf("upstream got Authorization %q, X-Other %q, body %q", hdr.Get("Authorization"), hdr.Get("X-Other"), body)
			}
			checkNoValue(t, "reflection", got)
			if !strings.Contains(got, "Bearer "+ph) || !strings.Contains(got, url.QueryEscape("Bearer "+ph)) ||
				!strings.Contains(got, base64.StdEncoding.EncodeToString([]byte(ph))) {
				t.Errorf("the reflection does not carry the placeholder's forms instead:\n%.400s", got[len(got)-400:])
			}
			r := rh.reflected()
			var header, inBody int
			for _, x := range r {
				if x.Credential != "API_KEY" || x.Host != "api.test" {
					t.Errorf("reflection %+v", x)
				}
				switch x.Where {
				case WhereHeader:
					header++
				case WhereBody:
					inBody++
				}
			}
			if header != 1 || inBody != 1 {
				t.Errorf("reflections %+v, want one in the header and one in the body", r)
			}
		})
	}
}

// TestCredentialEchoedBasic: a Basic credential the proxy re-encoded, echoed back in a response header and body,
// comes back as the sandbox's own encoding (of the placeholder), not base64 of the value.
func TestCredentialEchoedBasic(t *testing.T) {
	rh := newReflectHarness(t, Credential{Scheme: "Basic"})
	ph := rh.cr.Placeholder
	sent := basicAuth("git", ph)
	status, _, got := rh.send("https", false, map[string]string{"Authorization": sent}, "")
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	hdr, _ := rh.tls.last()
	produced := basicAuth("git", reflectValue)
	if hdr.Get("Authorization") != produced {
		t.Errorf("upstream got %q, want %q", hdr.Get("Authorization"), produced)
	}
	_, enc, _ := strings.Cut(produced, " ")
	checkNoValue(t, "echoed Basic", got, enc, url.QueryEscape(produced))
	if !strings.Contains(got, sent) {
		t.Errorf("the echo does not carry the sandbox's own Basic credential %q", sent)
	}
	if len(rh.reflected()) == 0 {
		t.Error("no reflection reported")
	}
}

// TestCredentialDefinition: a credential goes into its named header with its scheme only, and into a body field
// or another header only when it opts into that field by name.
func TestCredentialDefinition(t *testing.T) {
	rh := newReflectHarness(t, Credential{Header: "X-Api-Key", Fields: []string{"header:X-Backup-Key", "form:token", "json:secret"}})
	ph := rh.cr.Placeholder
	for _, tt := range []struct {
		name       string
		header     map[string]string
		body       string
		wantHeader map[string]string
		wantBody   string
	}{
		{"named header, no scheme", map[string]string{"X-Api-Key": ph, "Authorization": "Bearer " + ph},
			"", map[string]string{"X-Api-Key": reflectValue, "Authorization": "Bearer " + ph}, ""},
		{"opted-in header", map[string]string{"X-Backup-Key": ph, "X-Other": ph},
			"", map[string]string{"X-Backup-Key": reflectValue, "X-Other": ph}, ""},
		{"form field", map[string]string{"Content-Type": "application/x-www-form-urlencoded"},
			"a=1&token=" + ph + "&note=" + ph + "&xtoken=" + ph, nil, "a=1&token=" + reflectValue + "&note=" + ph + "&xtoken=" + ph},
		{"json member", map[string]string{"Content-Type": "application/json"},
			`{"x":{"secret" : "` + ph + `"},"other":"` + ph + `","secret":"` + ph + `-suffix"}`, nil,
			`{"x":{"secret" : "` + reflectValue + `"},"other":"` + ph + `","secret":"` + ph + `-suffix"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			status, _, got := rh.send("https", false, tt.header, tt.body)
			if status != http.StatusOK {
				t.Fatalf("status %d", status)
			}
			hdr, body := rh.tls.last()
			for k, v := range tt.wantHeader {
				if hdr.Get(k) != v {
					t.Errorf("upstream %s = %q, want %q", k, hdr.Get(k), v)
				}
			}
			if tt.body != "" && body != tt.wantBody {
				t.Errorf("upstream body %q, want %q", body, tt.wantBody)
			}
			checkNoValue(t, tt.name, got)
		})
	}
}

// TestCredentialPlaintext: over plain http:// the value is never injected: a request carrying the placeholder is
// refused (credential-plaintext, naming the credential) before it reaches the upstream, unless the credential
// allows plaintext; one without the placeholder goes through unchanged.
func TestCredentialPlaintext(t *testing.T) {
	rh := newReflectHarness(t, Credential{})
	ph := rh.cr.Placeholder
	status, reason, _ := rh.send("http", false, map[string]string{"Authorization": "Bearer " + ph}, "")
	if status != http.StatusForbidden || reason != ReasonPlaintext {
		t.Errorf("plain http with the placeholder: %d %q, want 403 %s", status, reason, ReasonPlaintext)
	}
	if hdr, _ := rh.plain.last(); hdr != nil {
		t.Errorf("the upstream got the refused request: %v", hdr)
	}
	if b := rh.reported(); len(b) != 1 || b[0].Reason != ReasonPlaintext || b[0].Rule != "API_KEY" {
		t.Errorf("blocks %+v", b)
	}
	if status, _, _ := rh.send("http", false, map[string]string{"Accept": "text/plain"}, ""); status != http.StatusOK {
		t.Errorf("plain http without the placeholder: %d", status)
	}

	open := newReflectHarness(t, Credential{AllowPlaintext: true})
	status, _, got := open.send("http", false, map[string]string{"Authorization": "Bearer " + open.cr.Placeholder}, "")
	hdr, _ := open.plain.last()
	if status != http.StatusOK || hdr.Get("Authorization") != "Bearer "+reflectValue {
		t.Errorf("allow_plaintext: %d, upstream got %q", status, hdr.Get("Authorization"))
	}
	checkNoValue(t, "allow_plaintext", got)
}

// TestScrubReader: the scrubber replaces every occurrence whatever the read sizes, and holds back at most the
// longest form less one between reads.
func TestScrubReader(t *testing.T) {
	reps := []replacement{{"SECRET-VALUE", "PLACEHOLDER-X", "A"}, {"U0VDUkVU", "b64", "A"}}
	in := strings.Repeat("ab SECRET-VALUE cd U0VDUkVU ", 5000) + "SECRET-VAL"
	want := strings.ReplaceAll(strings.ReplaceAll(in, "SECRET-VALUE", "PLACEHOLDER-X"), "U0VDUkVU", "b64")
	for _, size := range []int{1, 7, 4096, 1 << 20} {
		var n int
		s := newScrubReader(io.NopCloser(&chunked{s: in, n: size}), reps, func(string) { n++ })
		got, err := io.ReadAll(s)
		if err != nil || string(got) != want {
			t.Errorf("read size %d: %d bytes, %v; want %d", size, len(got), err, len(want))
		}
		if n != 1 {
			t.Errorf("read size %d: found reported %d times, want once per credential", size, n)
		}
		if len(s.in) > s.keep {
			t.Errorf("held back %d bytes, more than %d", len(s.in), s.keep)
		}
	}
}

// chunked reads s n bytes at a time.
type chunked struct {
	s string
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	k := min(len(p), c.n, len(c.s))
	copy(p, c.s[:k])
	c.s = c.s[k:]
	return k, nil
}
