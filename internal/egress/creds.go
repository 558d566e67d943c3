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

// bodyScanLimit bounds how much of a request body the proxy holds to inject credentials and look for leaks:
// an occurrence that starts within the first bodyScanLimit bytes is replaced (or refused); the rest of a
// longer body streams through unread. Holding the start of the body is what lets a leak be refused before
// any byte of the request reaches the upstream.
const bodyScanLimit = 1 << 20

// credPlan is what one request to one host does with the policy's credentials.
type credPlan struct {
	inject  []*credential // the credentials this host may receive: their placeholders become their values
	forbid  []needle      // what must not go there: the other credentials' placeholders and values
	longest int           // the longest placeholder or needle, in bytes
}

// needle is a string a request must not carry, and the credential it belongs to.
type needle struct {
	s    string
	name string
}

// planFor is the plan for requests to the normalised host and port. A value shared by a credential the host
// may receive is not forbidden there.
func (c *policy) planFor(name string, ip netip.Addr, isIP bool, port uint16) credPlan {
	var cp credPlan
	if len(c.creds) == 0 {
		return cp
	}
	allowed := make([]bool, len(c.creds))
	for i := range c.creds {
		cr := &c.creds[i]
		if _, ok := match(cr.hosts, name, ip, isIP, port); ok {
			allowed[i] = true
			cp.inject = append(cp.inject, cr)
			cp.longest = max(cp.longest, len(cr.placeholder))
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
		for _, in := range cp.inject {
			shared = shared || in.value == cr.value
		}
		if !shared {
			cp.forbid = append(cp.forbid, needle{cr.value, cr.name})
			cp.longest = max(cp.longest, len(cr.value))
		}
	}
	return cp
}

func (cp credPlan) empty() bool { return len(cp.inject) == 0 && len(cp.forbid) == 0 }

// apply refuses r when it carries a forbidden placeholder or value, in its URL, a header (a Basic
// credential decoded) or the first bodyScanLimit bytes of its body, and returns the name of the credential
// it would leak. Otherwise it replaces the placeholders of the credentials the host may receive, in every
// header value (a Basic credential decoded and encoded again) and in the first bodyScanLimit bytes of the
// body, fixing the Content-Length. Request trailers are dropped: they arrive after the request was checked.
// err is a failure to read the body.
func (cp credPlan) apply(r *http.Request) (leak string, err error) {
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
	if hasBody {
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

	for _, vs := range r.Header {
		for i, v := range vs {
			vs[i] = cp.injectHeader(v)
		}
	}
	if !hasBody {
		return "", nil
	}
	out := head
	for _, cr := range cp.inject {
		out = bytes.ReplaceAll(out, []byte(cr.placeholder), []byte(cr.value))
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
func (cp credPlan) found(s string) string {
	for _, n := range cp.forbid {
		if strings.Contains(s, n.s) {
			return n.name
		}
	}
	return ""
}

// injectHeader replaces the placeholders in one header value, inside a Basic credential too.
func (cp credPlan) injectHeader(v string) string {
	for _, cr := range cp.inject {
		v = strings.ReplaceAll(v, cr.placeholder, cr.value)
	}
	if dec, ok := decodeBasic(v); ok {
		out := dec
		for _, cr := range cp.inject {
			out = strings.ReplaceAll(out, cr.placeholder, cr.value)
		}
		if out != dec {
			scheme, _, _ := strings.Cut(strings.TrimSpace(v), " ")
			v = scheme + " " + base64.StdEncoding.EncodeToString([]byte(out))
		}
	}
	return v
}

// scrub replaces the injected values in response header values with their placeholders, so a server that
// echoes a credential in a header does not hand it to the sandbox. Response bodies are not scrubbed.
func (cp credPlan) scrub(h http.Header) {
	if len(cp.inject) == 0 {
		return
	}
	for _, vs := range h {
		for i, v := range vs {
			for _, cr := range cp.inject {
				v = strings.ReplaceAll(v, cr.value, cr.placeholder)
			}
			vs[i] = v
		}
	}
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
