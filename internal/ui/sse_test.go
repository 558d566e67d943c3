package ui

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestSSELoneCR: a lone CR in an event's data ends a line for an EventSource (as CRLF and LF do), so data
// carrying one (a command's text) must not end up as a field or an event of its own (issue 22, Low 12).
func TestSSELoneCR(t *testing.T) {
	rec := httptest.NewRecorder()
	s := &sse{w: rec, rc: http.NewResponseController(rec)}
	s.send("rows", "7", "<td>a\revent: signedout\r\rdata: x</td>\r\nnext\nlast")
	if s.err != nil {
		t.Fatal(s.err)
	}
	out := rec.Body.String()
	if strings.Contains(out, "\r") {
		t.Fatalf("a CR reached the stream: %q", out)
	}
	// Every line but the id and event fields is a data line, and the event ends only at the final blank line.
	lines := strings.Split(strings.TrimSuffix(out, "\n\n"), "\n")
	if lines[0] != "id: 7" || lines[1] != "event: rows" {
		t.Fatalf("fields: %q", lines[:2])
	}
	for _, l := range lines[2:] {
		if !strings.HasPrefix(l, "data: ") {
			t.Errorf("line %q is not a data line: the CR made a field of its own", l)
		}
	}
}
