package egress

import (
	"bytes"
	"io"
)

// Reflection is one response that carried an injected credential back towards the sandbox, in a form the proxy
// produced (the value, percent- or base64-encoded, or the Basic credential it wrote), and had it replaced by the
// placeholder's form before the sandbox saw it. It is what OnReflected receives and the credential_reflected
// event records. It never holds the value.
type Reflection struct {
	Credential string // the credential's name
	Host       string
	Port       uint16
	Where      string // WhereHeader or WhereBody
}

// Where a response reflected a credential.
const (
	WhereHeader = "header"
	WhereBody   = "body"
)

// scrubChunk is how much of a response body the scrubber reads at a time; with the longest form held back
// between reads, it is what the scrubber holds per response.
const scrubChunk = 32 << 10

// scrubReader streams a response body with every reflected form replaced by the placeholder's. It holds at most
// scrubChunk bytes plus the longest form less one (an occurrence split across two reads is held back until it
// is whole), so a body of any length is scrubbed in bounded memory. found is called once, at the first
// replacement of each credential.
type scrubReader struct {
	src   io.ReadCloser
	reps  []replacement // longest first
	keep  int           // the longest form less one: what may be the start of an occurrence
	found func(name string)
	seen  []string

	in    []byte // read, not yet scrubbed
	out   []byte // scrubbed, not yet returned
	chunk []byte
	err   error
}

func newScrubReader(src io.ReadCloser, reps []replacement, found func(string)) *scrubReader {
	longest := 0
	for _, r := range reps {
		longest = max(longest, len(r.from))
	}
	return &scrubReader{src: src, reps: reps, keep: longest - 1, found: found, chunk: make([]byte, scrubChunk)}
}

func (s *scrubReader) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		n, err := s.src.Read(s.chunk)
		s.in = append(s.in, s.chunk[:n]...)
		if err != nil {
			s.err = err
		}
		s.process(err != nil)
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	if len(s.out) == 0 {
		s.out = s.out[:0:0] // let the next process start a new buffer instead of growing a resliced one
	}
	return n, nil
}

// process moves what is scrubbed from in to out: every whole occurrence replaced, and all of the rest except
// what could be the start of one (all of it at the end of the body).
func (s *scrubReader) process(final bool) {
	for {
		at, which := -1, -1
		for i, r := range s.reps {
			if j := bytes.Index(s.in, []byte(r.from)); j >= 0 && (at < 0 || j < at) {
				at, which = j, i
			}
		}
		if at < 0 {
			break
		}
		r := s.reps[which]
		s.out = append(s.out, s.in[:at]...)
		s.out = append(s.out, r.to...)
		s.in = s.in[at+len(r.from):]
		if !containsString(s.seen, r.name) {
			s.seen = append(s.seen, r.name)
			if s.found != nil {
				s.found(r.name)
			}
		}
	}
	if final {
		s.out = append(s.out, s.in...)
		s.in = s.in[:0]
		return
	}
	if cut := len(s.in) - s.keep; cut > 0 {
		s.out = append(s.out, s.in[:cut]...)
		s.in = append(s.in[:0:0], s.in[cut:]...)
	}
}

func (s *scrubReader) Close() error { return s.src.Close() }

func containsString(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
