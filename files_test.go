package sandkeep_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/files"
)

// TestFiles is the library's file API on its driver (Docker: the workspace on the host; kubernetes, with
// SANDKEEP_TEST_DRIVER=kubernetes: the pod's claim, every operation through the pod's agent): the same answers,
// limits and faults either way, and nothing a command planted in the workspace leads out of it.
func TestFiles(t *testing.T) {
	s := newSuite(t, baseConfig(t))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	key := s.key("files", "alice")
	open := func(create bool, lim sandkeep.FileLimits) *sandkeep.Files {
		t.Helper()
		fs, err := s.m.FilesContext(ctx, key, create, lim)
		if err != nil {
			t.Fatalf("FilesContext(create %v): %v", create, err)
		}
		t.Cleanup(func() { fs.Close() })
		return fs
	}
	wantCode := func(what string, err error, code sandkeep.Code) {
		t.Helper()
		if sandkeep.CodeOf(err) != code {
			t.Errorf("%s: %v, want %s", what, err, code)
		}
	}

	// Nothing ever written for this user: FILE_NOT_FOUND, and no sandbox made for asking.
	_, err := s.m.FilesContext(ctx, key, false, sandkeep.FileLimits{})
	wantCode("a workspace never made", err, "FILE_NOT_FOUND")
	if _, err := s.m.Sandbox(ctx, key); sandkeep.CodeOf(err) != "SANDBOX_NOT_FOUND" {
		t.Errorf("opening no workspace made a sandbox: %v", err)
	}

	fs := open(true, sandkeep.FileLimits{MaxFileBytes: 1 << 20})
	data := make([]byte, 300<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if n, err := fs.Write(ctx, "dir/sub/data.bin", bytes.NewReader(data), 0o640); err != nil || n != int64(len(data)) {
		t.Fatalf("write: %d, %v", n, err)
	}
	uid := trim(s.sh(key, "id -u"))
	if got, want := s.sh(key, "stat -c '%u %a %s' dir/sub/data.bin; stat -c %u dir/sub"), uid+" 640 307200\n"+uid+"\n"; got != want {
		t.Errorf("the upload seen from the sandbox: %q, want %q", got, want)
	}
	rc, e, err := fs.OpenFile("/workspace/dir/sub/data.bin")
	if err != nil {
		t.Fatal(err)
	}
	back, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(back, data) || e.Size != int64(len(data)) || e.Type != files.TypeFile || e.Mode != "0640" {
		t.Errorf("download: %d bytes, %v, entry %+v", len(back), err, e)
	}

	// What a command planted: links out of the workspace, a FIFO, a big file.
	s.sh(key, "ln -s /etc/passwd pw && ln -s / root && ln -s .. up && mkfifo fifo && head -c 2000000 /dev/zero > big && echo keep > /tmp/outside")
	_, _, err = fs.OpenFile("pw")
	wantCode("download through a link", err, "FILE_TYPE")
	// Under gVisor a FIFO made in the sandbox lives in its kernel (the Sentry) and never reaches the host's
	// workspace: there is nothing to refuse, and the host must not see one.
	fifoWant, fifoType := sandkeep.Code("FILE_TYPE"), "other:"
	if s.cfg.Runtime == "runsc" {
		fifoWant, fifoType = "FILE_NOT_FOUND", "" // not in the listing
	}
	_, _, err = fs.OpenFile("fifo")
	wantCode("download of a FIFO", err, fifoWant)
	_, _, err = fs.OpenFile("big")
	wantCode("download over the file limit", err, "FILE_TOO_LARGE")
	_, err = fs.Write(ctx, "root/tmp/outside", strings.NewReader("x"), 0)
	wantCode("write through a link to /", err, "PATH_CONFLICT")
	_, err = fs.List("up")
	wantCode("list through a link", err, "FILE_TYPE")
	_, err = fs.Stat("../etc/passwd")
	wantCode("a path out of the workspace", err, "INVALID_PATH")
	_, err = fs.Write(ctx, "over", bytes.NewReader(make([]byte, 1<<20+1)), 0)
	wantCode("upload over the file limit", err, "FILE_TOO_LARGE")
	// An upload over a link replaces the link, never its target.
	if _, err := fs.Write(ctx, "pw", strings.NewReader("mine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := s.sh(key, "test -L pw || cat pw; cat /tmp/outside; test -e over || echo no-over; grep -c root /etc/passwd"); got != "mine\nkeep\nno-over\n1\n" {
		t.Errorf("after the refusals, from the sandbox: %q", got)
	}
	entries, err := fs.List(".")
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]string{}
	for _, e := range entries {
		types[e.Name] = e.Type + ":" + e.Target
	}
	if types["root"] != "symlink:/" || types["up"] != "symlink:.." || types["fifo"] != fifoType || types["dir"] != "dir:" || types["pw"] != "file:" {
		t.Errorf("listing: %v", types)
	}

	// A cut upload leaves nothing; a tar goes in and comes back whole, links as links.
	_, err = fs.Write(ctx, "cut.bin", io.MultiReader(bytes.NewReader(data[:100<<10]), iotest.ErrReader(errors.New("client gone"))), 0)
	var re *files.ReadError
	if !errors.As(err, &re) {
		t.Errorf("a cut upload: %v, want a ReadError", err)
	}
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for _, h := range []*tar.Header{
		{Name: "t/", Typeflag: tar.TypeDir, Mode: 0o750},
		{Name: "t/a.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2},
		{Name: "t/l", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte("a\n"))
		}
	}
	tw.Close()
	sum, err := fs.ExtractTar(ctx, "in", bytes.NewReader(tb.Bytes()))
	if err != nil || sum.Files != 1 || sum.Dirs != 1 || sum.Links != 1 || sum.Bytes != 2 {
		t.Errorf("extract: %+v, %v", sum, err)
	}
	_, err = fs.ExtractTar(ctx, "in", bytes.NewReader([]byte("not a tar at all, not at all, really not")))
	wantCode("extract of garbage", err, "INVALID_ARGUMENT")
	var out bytes.Buffer
	if err := fs.WriteTar(ctx, "in", &out); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name+"|"+h.Linkname)
	}
	if got := strings.Join(names, " "); got != "t/| t/a.txt| t/l|/etc" {
		t.Errorf("tar back: %s", got)
	}
	if got := s.sh(key, "test -e cut.bin || echo none; stat -c '%u %a' in/t in/t/a.txt"); got != "none\n"+uid+" 750\n"+uid+" 644\n" {
		t.Errorf("after the cut upload and the tar, from the sandbox: %q", got)
	}
	fs.Close()

	// A stopped sandbox: on kubernetes (an idle-stopped pod, its claim kept) it is started for the file API, as
	// a command would start it; on Docker the workspace is on the host and the sandbox stays as it is.
	if err := s.m.Stop(ctx, key); err != nil {
		t.Fatal(err)
	}
	fs = open(false, sandkeep.FileLimits{})
	if e, err := fs.Stat("dir/sub/data.bin"); err != nil || e.Size != int64(len(data)) {
		t.Errorf("stat after stop: %+v, %v", e, err)
	}
	want := "running"
	if !onKube {
		want = "stopped"
	}
	if sb, err := s.m.Sandbox(ctx, key); err != nil || sb.State != want {
		t.Errorf("the sandbox after the file API opened its workspace: %+v, %v; want %s", sb, err, want)
	}
}
