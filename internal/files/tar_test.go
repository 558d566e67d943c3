package files

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestTarRoundTrip archives a tree with nested directories, binary and empty files, modes and links, and
// extracts it into another workspace: what comes out is what went in.
func TestTarRoundTrip(t *testing.T) {
	src := newEnv(t, Limits{})
	ctx := context.Background()
	deep := make([]byte, 300<<10+3)
	rand.NewChaCha8([32]byte{7}).Read(deep)
	for _, f := range []struct {
		path string
		data []byte
		mode fs.FileMode
	}{
		{"a/b/c/deep.bin", deep, 0o644},
		{"a/empty", nil, 0o600},
		{"top.txt", []byte("top\n"), 0o640},
		{"bin/run.sh", []byte("#!/bin/sh\necho hi\n"), 0o755},
		{strings.Repeat("long-name-", 20) + "/" + strings.Repeat("x", 200), []byte("long"), 0o644},
	} {
		_, err := src.fs.Write(ctx, f.path, bytes.NewReader(f.data), f.mode)
		must(t, err)
	}
	must(t, os.Mkdir(filepath.Join(src.ws, "emptydir"), 0o750))
	must(t, os.Symlink("b/c/deep.bin", filepath.Join(src.ws, "a", "link")))
	must(t, os.Symlink("/etc/passwd", filepath.Join(src.ws, "a", "abs-link")))
	must(t, os.Symlink("../out", filepath.Join(src.ws, "out-link")))
	must(t, syscall.Mkfifo(filepath.Join(src.ws, "a", "fifo"), 0o644))
	ln, err := net.Listen("unix", filepath.Join(src.ws, "sock"))
	must(t, err)
	defer ln.Close()
	mtime := time.Date(2022, 2, 3, 4, 5, 6, 0, time.UTC)
	must(t, os.Chtimes(filepath.Join(src.ws, "top.txt"), mtime, mtime))

	var buf bytes.Buffer
	must(t, src.fs.WriteTar(ctx, ".", &buf))
	hdrs, bodies := readTar(t, buf.Bytes())
	var names []string
	for _, h := range hdrs {
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" {
			t.Errorf("%s carries an owner: %d:%d %q", h.Name, h.Uid, h.Gid, h.Uname)
		}
	}
	wantNames := []string{"a/", "a/abs-link", "a/b/", "a/b/c/", "a/b/c/deep.bin", "a/empty", "a/link", "bin/", "bin/run.sh",
		"emptydir/", strings.Repeat("long-name-", 20) + "/", strings.Repeat("long-name-", 20) + "/" + strings.Repeat("x", 200),
		"out-link", "top.txt"}
	if !slices.Equal(names, wantNames) {
		t.Fatalf("tar names\n %q\nwant (FIFO and socket left out)\n %q", names, wantNames)
	}
	for _, body := range bodies {
		if strings.Contains(body, sentinel) {
			t.Fatal("the tar carries data from outside the workspace")
		}
	}

	dst := newEnv(t, Limits{})
	summary, err := dst.fs.ExtractTar(ctx, "restored", bytes.NewReader(buf.Bytes()))
	must(t, err)
	if summary != (TarSummary{Files: 5, Dirs: 6, Links: 3, Bytes: int64(len(deep) + 4 + 18 + 4)}) {
		t.Errorf("summary %+v", summary)
	}
	// Compare the trees as the host sees them, minus what a tar does not carry.
	want := treeOf(t, src.ws)
	delete(want, "a/fifo")
	delete(want, "sock")
	if got := treeOf(t, filepath.Join(dst.ws, "restored")); !mapsEqual(got, want) {
		t.Fatalf("extracted tree differs:\n got %v\nwant %v", got, want)
	}
	fi, err := os.Stat(filepath.Join(dst.ws, "restored", "top.txt"))
	must(t, err)
	if !fi.ModTime().Equal(mtime) {
		t.Errorf("top.txt mtime %v, want %v", fi.ModTime(), mtime)
	}
	_ = filepath.WalkDir(filepath.Join(dst.ws, "restored"), func(p string, d fs.DirEntry, err error) error {
		must(t, err)
		checkOwner(t, p)
		return nil
	})
	src.untouched(t)
	dst.untouched(t)

	// A subdirectory's tar names entries relative to it.
	buf.Reset()
	must(t, src.fs.WriteTar(ctx, "/workspace/a/b", &buf))
	hdrs, _ = readTar(t, buf.Bytes())
	if len(hdrs) != 2 || hdrs[0].Name != "c/" || hdrs[1].Name != "c/deep.bin" {
		t.Fatalf("tar of a/b: %v", hdrs)
	}
}

// treeOf describes the tree under root: type, permission bits, content or link target.
func treeOf(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	must(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		desc := fi.Mode().String()
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			must(t, err)
			desc += " " + sum(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			must(t, err)
			desc += " -> " + target
		}
		out[rel] = desc
		return nil
	}))
	return out
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestExtractTarModesAndOwners(t *testing.T) {
	e := newEnv(t, Limits{})
	b := buildTar(t,
		tarEntry{name: "./", typ: tar.TypeDir, mode: 0o777},
		tarEntry{name: "d/", typ: tar.TypeDir, mode: 0o750},
		tarEntry{name: "d/suid", mode: 0o6755, body: "x"},
		tarEntry{name: "d/sticky/", typ: tar.TypeDir, mode: 0o1777},
		tarEntry{name: "implied/parent/f", mode: 0o600, body: "y"},
		tarEntry{name: "d/link", typ: tar.TypeSymlink, link: "/etc/shadow"},
	)
	sum, err := e.fs.ExtractTar(context.Background(), "/workspace", bytes.NewReader(b))
	must(t, err)
	if sum != (TarSummary{Files: 2, Dirs: 2, Links: 1, Bytes: 2}) {
		t.Errorf("summary %+v", sum)
	}
	for p, want := range map[string]fs.FileMode{
		".":                0o700 | fs.ModeDir, // the workspace keeps its mode whatever the tar says
		"d":                0o750 | fs.ModeDir,
		"d/suid":           0o755,
		"d/sticky":         0o777 | fs.ModeDir,
		"implied":          0o755 | fs.ModeDir,
		"implied/parent":   0o755 | fs.ModeDir,
		"implied/parent/f": 0o600,
		"d/link":           0o777 | fs.ModeSymlink,
	} {
		fi, err := os.Lstat(filepath.Join(e.ws, p))
		must(t, err)
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
		}
		checkOwner(t, filepath.Join(e.ws, p))
	}
	if target, _ := os.Readlink(filepath.Join(e.ws, "d/link")); target != "/etc/shadow" {
		t.Errorf("link target %q", target)
	}
	fi, err := os.Lstat(filepath.Join(e.ws, "d/suid"))
	must(t, err)
	if !fi.ModTime().Equal(time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)) {
		t.Errorf("mtime %v not kept", fi.ModTime())
	}
	e.noTemp(t)
}

func TestExtractTarRefusals(t *testing.T) {
	big := strings.Repeat("z", 101)
	for _, tc := range []struct {
		name    string
		dir     string
		entries []tarEntry
		raw     []byte // instead of entries
		code    fault.Code
		left    []string // written before the refused entry, and left (documented)
	}{
		{name: "dot-dot", entries: []tarEntry{{name: "../x", body: "pwn"}}, code: fault.InvalidPath},
		{name: "dot-dot into the outside dir", entries: []tarEntry{{name: "../out/secret", body: "pwn"}}, code: fault.InvalidPath},
		{name: "dot-dot that stays inside", entries: []tarEntry{{name: "a/../b", body: "x"}}, code: fault.InvalidPath},
		{name: "absolute", entries: []tarEntry{{name: "/etc/x", body: "pwn"}}, code: fault.InvalidPath},
		{name: "absolute under workspace", entries: []tarEntry{{name: "/workspace/x", body: "x"}}, code: fault.InvalidPath},
		{name: "dot-dot after good entries", entries: []tarEntry{{name: "ok.txt", body: "ok"}, {name: "../x", body: "pwn"}},
			code: fault.InvalidPath, left: []string{"ok.txt"}},
		{name: "hard link", entries: []tarEntry{{name: "f", body: "x"}, {name: "h", typ: tar.TypeLink, link: "f"}},
			code: fault.FileType, left: []string{"f"}},
		{name: "hard link out", entries: []tarEntry{{name: "h", typ: tar.TypeLink, link: "../out/secret"}}, code: fault.FileType},
		{name: "char device", entries: []tarEntry{{name: "null", typ: tar.TypeChar}}, code: fault.FileType},
		{name: "block device", entries: []tarEntry{{name: "sda", typ: tar.TypeBlock}}, code: fault.FileType},
		{name: "FIFO", entries: []tarEntry{{name: "p", typ: tar.TypeFifo}}, code: fault.FileType},
		{name: "file through a relative link out", entries: []tarEntry{
			{name: "esc", typ: tar.TypeSymlink, link: "../out"}, {name: "esc/pwn", body: "pwn"}},
			code: fault.PathConflict, left: []string{"esc"}},
		{name: "file over a host file through a link", entries: []tarEntry{
			{name: "esc", typ: tar.TypeSymlink, link: "../out"}, {name: "esc/secret", body: "pwn"}},
			code: fault.PathConflict, left: []string{"esc"}},
		{name: "dir through a link out", entries: []tarEntry{
			{name: "esc", typ: tar.TypeSymlink, link: "../out"}, {name: "esc/new/", typ: tar.TypeDir}},
			code: fault.PathConflict, left: []string{"esc"}},
		{name: "link through a link out", entries: []tarEntry{
			{name: "esc", typ: tar.TypeSymlink, link: "../out"}, {name: "esc/l", typ: tar.TypeSymlink, link: "x"}},
			code: fault.PathConflict, left: []string{"esc"}},
		{name: "file through a link inside", entries: []tarEntry{
			{name: "real/", typ: tar.TypeDir}, {name: "alias", typ: tar.TypeSymlink, link: "real"}, {name: "alias/f", body: "x"}},
			code: fault.PathConflict, left: []string{"real", "alias"}},
		{name: "file through a pre-planted link", entries: []tarEntry{{name: "out-abs/pwn", body: "pwn"}}, code: fault.PathConflict},
		{name: "into a pre-planted link", dir: "out-rel", entries: []tarEntry{{name: "pwn", body: "pwn"}}, code: fault.PathConflict},
		{name: "into a file", dir: "plain", entries: []tarEntry{{name: "x", body: "x"}}, code: fault.PathConflict},
		{name: "file over a directory", entries: []tarEntry{{name: "inside", body: "x"}}, code: fault.FileType},
		{name: "link over a directory", entries: []tarEntry{{name: "inside", typ: tar.TypeSymlink, link: "x"}}, code: fault.FileType},
		{name: "too many entries", entries: []tarEntry{{name: "1", body: "1"}, {name: "2", body: "2"}, {name: "3", body: "3"},
			{name: "4", body: "4"}}, code: fault.FileTooLarge, left: []string{"1", "2", "3"}},
		{name: "file over the limit", entries: []tarEntry{{name: "big", body: big}}, code: fault.FileTooLarge},
		{name: "files summing over the limit", entries: []tarEntry{{name: "1", body: big[:100]}, {name: "2", body: big[:100]},
			{name: "3", body: big[:1]}}, code: fault.FileTooLarge, left: []string{"1", "2"}},
		{name: "not a tar", raw: bytes.Repeat([]byte("garbage!"), 200), code: fault.InvalidArgument},
		{name: "dir path with dot-dot", dir: "../out", entries: []tarEntry{{name: "x", body: "x"}}, code: fault.InvalidPath},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Limits{MaxFileBytes: 100, MaxTarBytes: 200, MaxTarEntries: 3})
			e.plantLinks(t)
			must(t, os.WriteFile(filepath.Join(e.ws, "plain"), nil, 0o644))
			before := treeOf(t, e.ws)
			raw := tc.raw
			if raw == nil {
				raw = buildTar(t, tc.entries...)
			}
			_, err := e.fs.ExtractTar(context.Background(), tc.dir, bytes.NewReader(raw))
			wantCode(t, err, tc.code)
			e.untouched(t)
			e.noTemp(t)
			after := treeOf(t, e.ws)
			for _, l := range tc.left {
				if _, ok := after[l]; !ok {
					t.Errorf("%s, written before the refusal, is gone", l)
				}
				delete(after, l)
			}
			if !mapsEqual(before, after) {
				t.Errorf("the workspace changed beyond the entries before the refused one:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

func TestExtractTarTruncated(t *testing.T) {
	e := newEnv(t, Limits{})
	b := buildTar(t, tarEntry{name: "whole", body: "w"}, tarEntry{name: "cut", body: strings.Repeat("c", 5000)})
	_, err := e.fs.ExtractTar(context.Background(), "d", bytes.NewReader(b[:3*512+1000]))
	wantCode(t, err, fault.InvalidArgument)
	if _, err := os.Lstat(filepath.Join(e.ws, "d", "cut")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a cut-off entry was left: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(e.ws, "d", "whole")); err != nil || string(b) != "w" {
		t.Errorf("the entry before the cut: %q, %v", b, err)
	}
	e.noTemp(t)
}

func TestExtractTarCancelled(t *testing.T) {
	e := newEnv(t, Limits{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := e.fs.ExtractTar(ctx, "d", bytes.NewReader(buildTar(t, tarEntry{name: "f", body: "x"})))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if _, err := os.Lstat(filepath.Join(e.ws, "d")); !errors.Is(err, fs.ErrNotExist) {
		t.Error("a cancelled extraction created its directory")
	}
}

func TestWriteTarRefusalsAndLimits(t *testing.T) {
	e := newEnv(t, Limits{MaxFileBytes: 100, MaxTarBytes: 150, MaxTarEntries: 5})
	e.plantLinks(t)
	ctx := context.Background()
	must(t, os.WriteFile(filepath.Join(e.ws, "plain"), nil, 0o644))
	for _, tc := range []struct {
		dir  string
		code fault.Code
	}{
		{"plain", fault.FileType},
		{"out-rel", fault.FileType},
		{"out-abs", fault.FileType},
		{"out-rel/sub", fault.PathConflict},
		{"nope", fault.FileNotFound},
		{"../out", fault.InvalidPath},
	} {
		var buf bytes.Buffer
		wantCode(t, e.fs.WriteTar(ctx, tc.dir, &buf), tc.code)
		if buf.Len() != 0 {
			t.Errorf("WriteTar(%q) wrote %d bytes before refusing", tc.dir, buf.Len())
		}
	}

	write := func(p string, n int) {
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(e.ws, p)), 0o755))
		must(t, os.WriteFile(filepath.Join(e.ws, p), bytes.Repeat([]byte("x"), n), 0o644))
	}
	write("files/a", 100)
	var buf bytes.Buffer
	must(t, e.fs.WriteTar(ctx, "files", &buf))
	write("files/b", 51)
	wantCode(t, e.fs.WriteTar(ctx, "files", &buf), fault.FileTooLarge)
	write("big/a", 101)
	wantCode(t, e.fs.WriteTar(ctx, "big", &buf), fault.FileTooLarge)
	for _, n := range []string{"1", "2", "3", "4", "5"} {
		write("many/"+n, 0)
	}
	must(t, e.fs.WriteTar(ctx, "many", &buf))
	write("many/6", 0)
	wantCode(t, e.fs.WriteTar(ctx, "many", &buf), fault.FileTooLarge)
	write("nested/d1/d2/f", 0)
	must(t, e.fs.WriteTar(ctx, "nested", &buf))
}

// TestWriteTarPlantedLinks: a tree full of links pointing out is archived with the links as links, and no
// byte from outside.
func TestWriteTarPlantedLinks(t *testing.T) {
	e := newEnv(t, Limits{})
	e.plantLinks(t)
	var buf bytes.Buffer
	must(t, e.fs.WriteTar(context.Background(), "/workspace", &buf))
	hdrs, bodies := readTar(t, buf.Bytes())
	links := 0
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeSymlink {
			links++
			if target, _ := os.Readlink(filepath.Join(e.ws, h.Name)); target != h.Linkname {
				t.Errorf("%s: link target %q, want %q", h.Name, h.Linkname, target)
			}
		}
	}
	if links != 7 || len(bodies) != 0 || bytes.Contains(buf.Bytes(), []byte(sentinel)) {
		t.Fatalf("tar has %d links and files %v; want 7 links, no files, no outside data", links, bodies)
	}
	e.untouched(t)
}

// shrinkingWriter truncates a file the first time it is handed file data, as a sandbox process would while
// the host archives the file.
type shrinkingWriter struct {
	bytes.Buffer
	path string
	done bool
}

func (w *shrinkingWriter) Write(p []byte) (int, error) {
	if !w.done && w.Len() >= 512 { // past the first header: file data
		w.done = true
		if err := os.Truncate(w.path, 0); err != nil {
			return 0, err
		}
	}
	return w.Buffer.Write(p)
}

// TestWriteTarFileShrinks: a file cut short while archived is padded with zeros, so the stream stays a valid
// tar with the size its header announced.
func TestWriteTarFileShrinks(t *testing.T) {
	if viaAgent {
		t.Skip("the shrink is made by the tar's writer after its first chunk, which through the agent is buffered ahead of it; the agent runs the same code, tested in the first run")
	}
	e := newEnv(t, Limits{})
	p := filepath.Join(e.ws, "f")
	must(t, os.WriteFile(p, bytes.Repeat([]byte("a"), 2*bufSize), 0o644))
	w := &shrinkingWriter{path: p}
	must(t, e.fs.WriteTar(context.Background(), ".", w))
	hdrs, bodies := readTar(t, w.Bytes())
	want := strings.Repeat("a", bufSize) + strings.Repeat("\x00", bufSize)
	if len(hdrs) != 1 || hdrs[0].Size != 2*bufSize || bodies["f"] != want {
		t.Fatalf("headers %v, body of %d bytes; want the first chunk then zeros", hdrs, len(bodies["f"]))
	}
}
