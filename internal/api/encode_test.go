package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep"
)

// TestWriteExecResponseSame: the streamed answer is byte for byte what encoding the whole value gives, for output
// that straddles the chunk size with multi-byte runes, invalid UTF-8, control bytes, HTML and line separators.
func TestWriteExecResponseSame(t *testing.T) {
	long := strings.Repeat("é", encodeChunk/2+1) + "\x00\x01\b\f\r\n\x1f\x7f<&>\u2028\u2029\\" + string([]byte{0xff, 0xe2, 0x82}) + strings.Repeat("x", encodeChunk)
	for _, res := range []*sandkeep.ExecResult{
		{},
		{ExitCode: 3, Stdout: "hello\n", Stderr: "oops \"quoted\"\t", StdoutTruncated: true, Transport: "agent"},
		{Stdout: long, Stderr: long[3:], Sandbox: sandkeep.SandboxRef{Name: "n", Tenant: "a\"b"}},
		{Stdout: strings.Repeat("\x00", 3*encodeChunk+5)},
	} {
		resp := execResponse(res, "req-1")
		want := httptest.NewRecorder()
		writeJSON(want, http.StatusOK, resp)
		got := httptest.NewRecorder()
		writeExecResponse(got, http.StatusOK, resp)
		if !bytes.Equal(got.Body.Bytes(), want.Body.Bytes()) {
			t.Errorf("streamed answer differs (%d bytes, want %d)", got.Body.Len(), want.Body.Len())
		}
		if got.Header().Get("Content-Type") != "application/json" {
			t.Errorf("Content-Type %q", got.Header().Get("Content-Type"))
		}
	}
}

// TestExecAnswerHeap: a non-streaming exec whose command printed 16 MiB of NUL bytes (96 MiB as JSON) is answered
// with the server allocating a small multiple of the output, not of its encoding: under 3x the output in all,
// the output itself included.
func TestExecAnswerHeap(t *testing.T) {
	const size = 16 << 20
	e := newEnv(t, nil)
	out := strings.Repeat("\x00", size)
	e.be.ExecHook = func(context.Context, sandkeep.Key, sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
		return &sandkeep.ExecResult{Stdout: out}, nil // made before the measurement: what the result costs anyway
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	resp := e.exec("u1", `{"argv":["yes"],"output_limit":16777216}`)
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	runtime.ReadMemStats(&after)
	if err != nil || resp.StatusCode != http.StatusOK || n < 6*size {
		t.Fatalf("status %d, %d bytes, %v", resp.StatusCode, n, err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 3*size {
		t.Errorf("answering 16 MiB of output allocated %d MiB, want under %d MiB", alloc>>20, 3*size>>20)
	} else {
		t.Logf("answering %d MiB of output (%d MiB as JSON) allocated %.1f MiB", size>>20, n>>20, float64(alloc)/(1<<20))
	}
}

// FuzzWriteJSONString: the streaming escaper writes what encoding/json writes (without HTML escaping), for any bytes.
func FuzzWriteJSONString(f *testing.F) {
	for _, s := range []string{"", "a\x00b", "\u2028\u2029", string([]byte{0xff, 0xc3}), "é<&>\"\\\b\f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s)
		var got bytes.Buffer
		bw := bufio.NewWriter(&got)
		writeJSONString(bw, s)
		_ = bw.Flush()
		if w := want.Bytes(); !bytes.Equal(got.Bytes(), w[1:len(w)-2]) {
			t.Fatalf("%q: wrote %q, encoding/json %q", s, got.Bytes(), w)
		}
	})
}
