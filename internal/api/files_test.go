package api

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/files"
)

func (e *env) put(path string, body io.Reader, hdr ...string) *http.Response {
	return e.req("PUT", "/v1/sandboxes/alice/files/"+path, e.tok, body, hdr...)
}

func (e *env) get(path string) *http.Response {
	return e.req("GET", "/v1/sandboxes/alice/files/"+path, e.tok, nil)
}

func TestFileRoundTrips(t *testing.T) {
	e := newEnv(t, nil)
	binary := make([]byte, 256*4)
	for i := range binary {
		binary[i] = byte(i)
	}
	for _, tc := range []struct {
		name, path string
		data       []byte
	}{
		{"binary", "bin/all-bytes", binary},
		{"empty", "empty", nil},
		{"nested new dirs", "a/b/c/d.txt", []byte("deep\n")},
		{"absolute under /workspace", "%2Fworkspace/abs.txt", []byte("abs")},
		{"name with spaces", "with%20space.txt", []byte("sp")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := decodeJSON[FileWritten](t, e.put(tc.path, bytes.NewReader(tc.data), "Content-Type", "application/octet-stream"))
			if w.Bytes != int64(len(tc.data)) {
				t.Errorf("wrote %d bytes, want %d", w.Bytes, len(tc.data))
			}
			resp := e.get(tc.path)
			got := readAll(t, resp)
			if resp.StatusCode != 200 || got != string(tc.data) {
				t.Fatalf("download: %d, %d bytes", resp.StatusCode, len(got))
			}
			if resp.Header.Get("Content-Type") != "application/octet-stream" || resp.Header.Get(ModeHeader) != "0644" {
				t.Errorf("headers %v", resp.Header)
			}
		})
	}
	decodeJSON[FileWritten](t, e.put("x.sh?mode=0755", strings.NewReader("#!/bin/sh\n")))
	if m := e.get("x.sh").Header.Get(ModeHeader); m != "0755" {
		t.Errorf("mode %q, want 0755", m)
	}
	list := decodeJSON[FileList](t, e.get("?list=1"))
	var names []string
	for _, en := range list.Entries {
		names = append(names, en.Name+":"+en.Type)
	}
	want := []string{"a:dir", "abs.txt:file", "bin:dir", "empty:file", "with space.txt:file", "x.sh:file"}
	if !slices.Equal(names, want) {
		t.Errorf("listing %v, want %v", names, want)
	}
}

func TestTarRoundTrip(t *testing.T) {
	e := newEnv(t, nil)
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	for _, f := range []struct {
		name string
		typ  byte
		body string
	}{
		{"src/", tar.TypeDir, ""},
		{"src/pkg/", tar.TypeDir, ""},
		{"src/pkg/main.go", tar.TypeReg, "package main\n"},
		{"src/README", tar.TypeReg, "read me\n"},
		{"src/link", tar.TypeSymlink, "pkg/main.go"},
	} {
		h := &tar.Header{Name: f.name, Typeflag: f.typ, Mode: 0o644, Size: int64(len(f.body))}
		if f.typ == tar.TypeDir {
			h.Mode = 0o755
		}
		if f.typ == tar.TypeSymlink {
			h.Linkname, h.Size = f.body, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(tw, f.body)
	}
	tw.Close()
	sum := decodeJSON[files.TarSummary](t, e.put("proj", &in, "Content-Type", "application/x-tar"))
	if sum.Files != 2 || sum.Links != 1 {
		t.Errorf("summary %+v", sum)
	}
	if got := readAll(t, e.get("proj/src/pkg/main.go")); got != "package main\n" {
		t.Errorf("extracted file: %q", got)
	}
	resp := e.get("proj")
	if resp.Header.Get("Content-Type") != ctTar {
		t.Fatalf("directory download: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	tr := tar.NewReader(resp.Body)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[strings.TrimSuffix(h.Name, "/")] = string(b) + h.Linkname
	}
	for name, want := range map[string]string{"src/pkg/main.go": "package main\n", "src/README": "read me\n", "src/link": "pkg/main.go"} {
		if got[name] != want {
			t.Errorf("tar entry %s = %q, want %q (all: %v)", name, got[name], want, got)
		}
	}
	// A symlink is refused as a file to download: it is never followed.
	wantError(t, e.get("proj/src/link"), http.StatusConflict, "FILE_TYPE")
}

func TestFileRefusals(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxUploadBytes = 1000 })
	// Nothing yet: the workspace itself is missing.
	eb := wantError(t, e.get("f"), http.StatusNotFound, "FILE_NOT_FOUND")
	if strings.Contains(eb.Message, e.be.Root()) {
		t.Errorf("the answer names a host path: %+v", eb)
	}
	decodeJSON[FileWritten](t, e.put("ok", strings.NewReader("x")))
	key, _ := sandkeep.NewKey("acme", "alice")
	outside := filepath.Join(filepath.Dir(e.be.Root()), "outside")
	if err := os.WriteFile(outside, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(e.be.Root(), key.Hex(), "escape")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, method, path, body string
		hdr                      []string
		status                   int
		code                     string
	}{
		{"dot-dot", "GET", "..%2F..%2Fetc%2Fpasswd", "", nil, 400, "INVALID_PATH"},
		{"dot-dot upload", "PUT", "a%2F..%2F..%2Fx", "x", nil, 400, "INVALID_PATH"},
		{"absolute outside", "GET", "%2Fetc%2Fpasswd", "", nil, 400, "INVALID_PATH"},
		{"symlink out", "GET", "escape", "", nil, 409, "FILE_TYPE"},
		{"write through a symlink", "PUT", "escape", "pwned", nil, 0, ""},
		{"missing", "GET", "nope", "", nil, 404, "FILE_NOT_FOUND"},
		{"unknown parameter", "GET", "ok?recursive=1", "", nil, 400, "REQUEST_INVALID"},
		{"bad mode", "PUT", "m?mode=4755", "x", nil, 400, "REQUEST_INVALID"},
		{"mode with a tar", "PUT", "d?mode=0644", "", []string{"Content-Type", ctTar}, 400, "REQUEST_INVALID"},
		{"declared too large", "PUT", "big", strings.Repeat("b", 1001), nil, 413, "REQUEST_TOO_LARGE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.req(tc.method, "/v1/sandboxes/alice/files/"+tc.path, e.tok, strings.NewReader(tc.body), tc.hdr...)
			if tc.status == 0 { // whatever the answer, the file outside is untouched
				readAll(t, resp)
				return
			}
			wantError(t, resp, tc.status, tc.code)
		})
	}
	// A chunked body (no Content-Length) past the bound: refused, and nothing is left.
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write(bytes.Repeat([]byte("c"), 2000))
		pw.Close()
	}()
	wantError(t, e.put("chunked", pr), http.StatusRequestEntityTooLarge, "REQUEST_TOO_LARGE")
	wantError(t, e.get("chunked"), http.StatusNotFound, "FILE_NOT_FOUND")
	wantError(t, e.get("big"), http.StatusNotFound, "FILE_NOT_FOUND")
	if b, _ := os.ReadFile(outside); string(b) != "host secret" {
		t.Errorf("the file outside the workspace is now %q", b)
	}
}

// pattern is an endless deterministic byte stream.
type pattern struct{ n byte }

func (p *pattern) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = p.n
		p.n = p.n*31 + 7
	}
	return len(b), nil
}

func TestLargeFileStreamsWithBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 200 MiB")
	}
	const size = 100 << 20
	e := newEnv(t, nil)
	want := sha256.New()
	if _, err := io.Copy(want, io.LimitReader(&pattern{}, size)); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	r, _ := http.NewRequestWithContext(context.Background(), "PUT", e.ts.URL+"/v1/sandboxes/alice/files/big.bin",
		io.LimitReader(&pattern{}, size))
	r.Header.Set("Authorization", "Bearer "+e.tok)
	r.ContentLength = size
	resp, err := e.ts.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	if w := decodeJSON[FileWritten](t, resp); w.Bytes != size {
		t.Fatalf("wrote %d", w.Bytes)
	}
	resp = e.get("big.bin")
	got := sha256.New()
	n, err := io.Copy(got, resp.Body)
	if err != nil || n != size || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatalf("download: %d bytes, %v, digest match %v", n, err, bytes.Equal(got.Sum(nil), want.Sum(nil)))
	}
	runtime.ReadMemStats(&after)
	// 200 MiB went through; a copy that buffered either way would allocate at least 100 MiB.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
		t.Errorf("moving 2 x 100 MiB allocated %d MiB", alloc>>20)
	}
}

// A sandbox process swaps a directory for a symlink to the host in a loop while the host downloads through the
// API: no answer ever carries the host's file.
func TestSymlinkSwapRaceNeverLeaks(t *testing.T) {
	e := newEnv(t, nil)
	decodeJSON[FileWritten](t, e.put("d/f", strings.NewReader("inside")))
	key, _ := sandkeep.NewKey("acme", "alice")
	ws := filepath.Join(e.be.Root(), key.Hex())
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "f"), []byte("HOST SECRET"), 0o644); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		d, real := filepath.Join(ws, "d"), filepath.Join(ws, "d.real")
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = os.Rename(d, real)
			_ = os.Symlink(outside, d)
			_ = os.Remove(d)
			_ = os.Rename(real, d)
		}
	}()
	defer func() { close(stop); <-done }()
	for i := range 300 {
		for _, p := range []string{"d/f", "d", "d?list=1", "d%2Ff"} {
			resp := e.get(p)
			body, _ := io.ReadAll(resp.Body) // a download cut off mid-way is a refusal too
			resp.Body.Close()
			// The host's file is 11 bytes: a listing that followed the link would show that size.
			if bytes.Contains(body, []byte("HOST SECRET")) || bytes.Contains(body, []byte(`"size":11`)) {
				t.Fatalf("iteration %d, GET %s: the host's file leaked (status %d)", i, p, resp.StatusCode)
			}
		}
	}
}
