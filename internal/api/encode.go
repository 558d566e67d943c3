package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"unicode/utf8"
)

// A non-streaming exec answer carries the whole output in two JSON strings, and JSON writes a control byte as
// six ("\u0000"): encoded whole, 16 MiB of NULs became a 96 MiB buffer grown by doubling, next to the output
// itself. writeExecResponse writes the same bytes as writeJSON (the same field order and escaping) but streams
// stdout and stderr through a small buffer, so the answer costs the output once, plus a bounded buffer.

// encodeChunk is how much of an output string is escaped at a time.
const encodeChunk = 32 << 10

// writeExecResponse writes resp as writeJSON would, streaming the output strings.
func writeExecResponse(w http.ResponseWriter, status int, resp ExecResponse) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	bw := bufio.NewWriterSize(w, encodeChunk)
	rest := resp
	stdout, stderr := rest.Stdout, rest.Stderr
	rest.Stdout, rest.Stderr = "", ""
	// The other fields, encoded as writeJSON encodes them; the two strings are empty there, and written in place.
	var head bytes.Buffer
	enc := json.NewEncoder(&head)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(rest); err != nil {
		return
	}
	b := head.Bytes()
	for _, f := range []struct{ key, val string }{{`"stdout":""`, stdout}, {`"stderr":""`, stderr}} {
		i := bytes.Index(b, []byte(f.key))
		if i < 0 { // cannot happen: the fields are not omitempty
			_, _ = bw.Write(b)
			_ = bw.Flush()
			return
		}
		_, _ = bw.Write(b[:i+len(f.key)-1]) // up to and with the opening quote
		writeJSONString(bw, f.val)
		b = b[i+len(f.key)-1:] // from the closing quote
	}
	_, _ = bw.Write(b)
	_ = bw.Flush()
}

// writeJSONString writes the inside of s as a JSON string (no quotes), escaped exactly as encoding/json escapes it
// without HTML escaping (TestWriteExecResponseSame holds it to that), through bw: nothing of the size of s is
// allocated.
func writeJSONString(bw *bufio.Writer, s string) {
	const hex = "0123456789abcdef"
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			_, _ = bw.WriteString(s[start:i])
			switch b {
			case '"', '\\':
				_ = bw.WriteByte('\\')
				_ = bw.WriteByte(b)
			case '\b':
				_, _ = bw.WriteString(`\b`)
			case '\f':
				_, _ = bw.WriteString(`\f`)
			case '\n':
				_, _ = bw.WriteString(`\n`)
			case '\r':
				_, _ = bw.WriteString(`\r`)
			case '\t':
				_, _ = bw.WriteString(`\t`)
			default:
				_, _ = bw.WriteString(`\u00`)
				_ = bw.WriteByte(hex[b>>4])
				_ = bw.WriteByte(hex[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			_, _ = bw.WriteString(s[start:i])
			_, _ = bw.WriteString(`\ufffd`)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			_, _ = bw.WriteString(s[start:i])
			_, _ = bw.WriteString(`\u202`)
			_ = bw.WriteByte(hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	_, _ = bw.WriteString(s[start:])
}
