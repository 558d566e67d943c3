package egress

import (
	"bytes"
	"encoding/base64"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// bodyScanLimit bounds how much of a request body the proxy holds to look for leaks (and to inject a credential
// into a named body field): an occurrence that starts within the first bodyScanLimit bytes is refused (or
// replaced); the rest of a longer body streams through unread. Holding the start of the body is what lets a
// leak be refused before any byte of the request reaches the upstream.
const bodyScanLimit = 1 << 20

// credPlan is what one request to one host does with the policy's credentials.
type credPlan struct {
	inject  []*credential // the credentials this host may receive, where their definitions say
	plain   []*credential // those it may receive, but not in this plain-HTTP request (no AllowPlaintext)
	forbid  []needle      // what must not go there: the other credentials' placeholders and values
	longest int           // the longest placeholder or needle, in bytes
	fields  bool          // an injected credential names a body field: the body's start is read for it

	produced []replacement // what apply wrote for this request that is not a plain form of a value (Basic)
}

// needle is a string a request must not carry, and the credential it belongs to.
type needle struct {
	s    string
	name string
}

// replacement is one form of an injected value, as a response may reflect it, and what the sandbox sees instead.
type replacement struct {
	from, to string
	name     string // the credential
}

// planFor is the plan for requests to the normalised host and port, over TLS (inspected) or not. A value shared
// by a credential the host may receive is not forbidden there.
func (c *policy) planFor(name string, ip netip.Addr, isIP bool, port uint16, tls bool) credPlan {
	var cp credPlan
	if len(c.creds) == 0 {
		return cp
	}
	allowed := make([]bool, len(c.creds))
	var may []*credential
	for i := range c.creds {
		cr := &c.creds[i]
		if _, ok := match(cr.hosts, name, ip, isIP, port); ok {
			allowed[i] = true
			may = append(may, cr)
			cp.longest = max(cp.longest, len(cr.placeholder))
			if !tls && !cr.plaintext {
				cp.plain = append(cp.plain, cr)
				continue
			}
			cp.inject = append(cp.inject, cr)
			cp.fields = cp.fields || len(cr.form) > 0 || len(cr.json) > 0
		}
	}
	for i := range c.creds {
		if allowed[i] {
			continue
		}
		cr := &c.creds[i]
		cp.forbid = append(cp.forbid, needle{cr.placeholder, cr.name})
		cp.longest = max(cp.longest, len(cr.placeholder))
		shared := false
		for _, in := range may {
			shared = shared || in.value == cr.value
		}
		if !shared {
			cp.forbid = append(cp.forbid, needle{cr.value, cr.name})
			cp.longest = max(cp.longest, len(cr.value))
		}
	}
	return cp
}

// scansBody reports whether apply reads the start of r's body.
func (cp *credPlan) scansBody(r *http.Request) bool {
	return !cp.empty() && r.Body != nil && r.Body != http.NoBody && (len(cp.forbid) > 0 || cp.fields)
}

func (cp *credPlan) empty() bool {
	return len(cp.inject) == 0 && len(cp.forbid) == 0 && len(cp.plain) == 0
}

// plaintext returns the name of a credential whose placeholder r carries in a header although r is plain HTTP
// and the credential may go only into TLS: r is refused rather than sent without the value the caller wanted,
// so the refusal says why. "" when there is none.
func (cp *credPlan) plaintext(r *http.Request) string {
	for _, cr := range cp.plain {
		for _, vs := range r.Header {
			for _, v := range vs {
				dec, _ := decodeBasic(v)
				if strings.Contains(v, cr.placeholder) || strings.Contains(dec, cr.placeholder) {
					return cr.name
				}
			}
		}
	}
	return ""
}

// apply refuses r when it carries a forbidden placeholder or value, in its URL, a header (a Basic credential
// decoded) or the first bodyScanLimit bytes of its body, and returns the name of the credential it would leak.
// Otherwise it injects the credentials the host may receive where their definitions say, and nowhere else: in
// the credential's header, written "<scheme> <placeholder>" (or, for Basic, as the user or password of a Basic
// credential), and in the headers and body fields the credential names; a placeholder anywhere else is forwarded
// as it is. Request trailers are dropped: they arrive after the request was checked. When it injected, the
// request asks for an unencoded response, so the response body can be scrubbed. err is a failure to read the body.
func (cp *credPlan) apply(r *http.Request) (leak string, err error) {
	if cp.empty() {
		return "", nil
	}
	r.Trailer = nil
	if name := cp.found(r.URL.EscapedPath()); name != "" {
		return name, nil
	}
	if name := cp.found(r.URL.Path); name != "" {
		return name, nil
	}
	if name := cp.found(r.URL.RawQuery); name != "" {
		return name, nil
	}
	if q, err := url.QueryUnescape(r.URL.RawQuery); err == nil {
		if name := cp.found(q); name != "" {
			return name, nil
		}
	}
	for k, vs := range r.Header {
		if name := cp.found(k); name != "" {
			return name, nil
		}
		for _, v := range vs {
			if name := cp.found(v); name != "" {
				return name, nil
			}
			if dec, ok := decodeBasic(v); ok {
				if name := cp.found(dec); name != "" {
					return name, nil
				}
			}
		}
	}
	var head []byte
	more := false
	hasBody := r.Body != nil && r.Body != http.NoBody
	if hasBody && (len(cp.forbid) > 0 || cp.fields) {
		limit := bodyScanLimit + cp.longest - 1 // so an occurrence that starts within the bound is whole
		head, err = io.ReadAll(io.LimitReader(r.Body, int64(limit)))
		if err != nil {
			return "", err
		}
		more = len(head) == limit
		for _, n := range cp.forbid {
			if bytes.Contains(head, []byte(n.s)) {
				return n.name, nil
			}
		}
	}

	for _, cr := range cp.inject {
		if vs := r.Header[cr.header]; len(vs) > 0 {
			for i, v := range vs {
				out, produced, was := cr.injectHeader(v)
				vs[i] = out
				if produced != "" {
					cp.produced = append(cp.produced, replacement{from: produced, to: was, name: cr.name})
				}
			}
		}
		for _, h := range cr.headers {
			for i, v := range r.Header[h] {
				if strings.TrimSpace(v) == cr.placeholder {
					r.Header[h][i] = cr.value
				}
			}
		}
	}
	if len(cp.inject) > 0 {
		r.Header.Set("Accept-Encoding", "identity")
	}
	if head == nil {
		return "", nil
	}
	out := head
	if cp.fields {
		for _, cr := range cp.inject {
			out = cr.injectFields(out)
		}
	}
	if !more {
		r.Body = io.NopCloser(bytes.NewReader(out))
		r.ContentLength = int64(len(out))
		return "", nil
	}
	if r.ContentLength >= 0 {
		r.ContentLength += int64(len(out) - len(head))
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(out), r.Body), r.Body}
	return "", nil
}

// found returns the name of the credential whose forbidden string s contains, or "".
func (cp *credPlan) found(s string) string {
	for _, n := range cp.forbid {
		if strings.Contains(s, n.s) {
			return n.name
		}
	}
	return ""
}

// injectHeader puts the value into v, a value of the credential's header, when v is the placeholder written the
// way the definition says: "<scheme> <placeholder>" (any case of the scheme), the placeholder alone without a
// scheme, or for Basic a Basic credential whose user or password is the placeholder. Anything else is left as it
// is. produced is the part of the result a response may reflect that is not the value itself (the new base64
// of a Basic credential), or "", and was what it replaced.
func (cr *credential) injectHeader(v string) (out, produced, was string) {
	t := strings.TrimSpace(v)
	if cr.scheme == "" {
		if t == cr.placeholder {
			return cr.value, "", ""
		}
		return v, "", ""
	}
	scheme, rest, ok := strings.Cut(t, " ")
	if !ok || !strings.EqualFold(scheme, cr.scheme) {
		return v, "", ""
	}
	rest = strings.TrimSpace(rest)
	if !cr.basic {
		if rest == cr.placeholder {
			return cr.scheme + " " + cr.value, "", ""
		}
		return v, "", ""
	}
	b, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return v, "", ""
	}
	user, pass, ok := strings.Cut(string(b), ":")
	switch {
	case ok && pass == cr.placeholder:
		pass = cr.value
	case ok && user == cr.placeholder:
		user = cr.value
	default:
		return v, "", ""
	}
	enc := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	return cr.scheme + " " + enc, enc, rest
}

// injectFields replaces the placeholder where it is the whole value of one of the credential's named body fields:
// a form field (name=PLACEHOLDER, between & or the ends) or a JSON member ("name": "PLACEHOLDER", at any depth).
func (cr *credential) injectFields(body []byte) []byte {
	ph := []byte(cr.placeholder)
	var out []byte
	last := 0
	for i := 0; ; {
		j := bytes.Index(body[i:], ph)
		if j < 0 {
			break
		}
		at := i + j
		end := at + len(ph)
		if cr.namedField(body[:at], body[end:]) {
			out = append(out, body[last:at]...)
			out = append(out, cr.value...)
			last = end
		}
		i = end
	}
	if out == nil {
		return body
	}
	return append(out, body[last:]...)
}

// namedField reports whether an occurrence of the placeholder between before and after is the whole value of one
// of the credential's form fields or JSON members.
func (cr *credential) namedField(before, after []byte) bool {
	for _, f := range cr.form {
		k := []byte(url.QueryEscape(f) + "=")
		if bytes.HasSuffix(before, k) {
			pre := before[:len(before)-len(k)]
			if (len(pre) == 0 || pre[len(pre)-1] == '&') && (len(after) == 0 || after[0] == '&') {
				return true
			}
		}
	}
	if len(cr.json) == 0 || len(after) == 0 || after[0] != '"' || len(before) == 0 || before[len(before)-1] != '"' {
		return false
	}
	b := bytes.TrimRight(before[:len(before)-1], " \t\r\n")
	if len(b) == 0 || b[len(b)-1] != ':' {
		return false
	}
	b = bytes.TrimRight(b[:len(b)-1], " \t\r\n")
	for _, f := range cr.json {
		if bytes.HasSuffix(b, []byte(`"`+f+`"`)) {
			return true
		}
	}
	return false
}

// reflections are the forms of the plan's injected values a response may carry back, each with what the sandbox
// sees in its place: the value, its percent-encodings and base64 encodings, and the Basic credentials apply
// produced. The placeholder's own forms replace them.
func (cp *credPlan) reflections() []replacement {
	if len(cp.inject) == 0 {
		return nil
	}
	out := make([]replacement, 0, len(cp.inject)*7+len(cp.produced))
	escapes := []func(string) string{url.QueryEscape, url.PathEscape}
	for _, pr := range cp.produced {
		out = append(out, pr)
		for _, enc := range escapes {
			if e := enc(pr.from); e != pr.from {
				out = append(out, replacement{e, enc(pr.to), pr.name})
			}
		}
	}
	for _, cr := range cp.inject {
		out = append(out, replacement{cr.value, cr.placeholder, cr.name})
		for _, enc := range escapes {
			if e := enc(cr.value); e != cr.value {
				out = append(out, replacement{e, enc(cr.placeholder), cr.name})
			}
		}
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
			out = append(out, replacement{enc.EncodeToString([]byte(cr.value)), enc.EncodeToString([]byte(cr.placeholder)), cr.name})
		}
	}
	// Longer forms first: a padded base64 form contains its raw form.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && len(out[j].from) > len(out[j-1].from); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// scrub replaces every reflected form of the injected values in the response header values with the
// placeholder's, and returns the names of the credentials it found.
func scrubHeader(h http.Header, reps []replacement) (found []string) {
	for _, vs := range h {
		for i, v := range vs {
			for _, rp := range reps {
				if strings.Contains(v, rp.from) {
					v = strings.ReplaceAll(v, rp.from, rp.to)
					found = appendOnce(found, rp.name)
				}
			}
			vs[i] = v
		}
	}
	return found
}

func appendOnce(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

// decodeBasic returns the decoded user:password of a "Basic <base64>" header value.
func decodeBasic(v string) (string, bool) {
	scheme, cred, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", false
	}
	return string(b), true
}
