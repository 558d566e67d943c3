package files

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandkeep/sandkeep/internal/fault"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sentinel is what the files outside the workspace hold; no operation may ever return or change it.
const sentinel = "SENTINEL: host data outside the workspace"

// testOwner is the sandbox user tests create files as: a foreign one when running as root, so that a test
// can tell that chown was applied; otherwise -1 (unchanged).
func testOwner() (uid, gid int) {
	if os.Geteuid() == 0 {
		return 1234, 5678
	}
	return -1, -1
}

// env is a workspace next to an "outside" directory holding sentinel files, as on a host where the
// workspace's neighbours are other tenants' data.
type env struct {
	fs     *FS
	ws     string // host path of the workspace
	out    string // host path of the outside directory
	before map[string]string
}

func newEnv(t testing.TB, lim Limits) *env {
	t.Helper()
	parent := t.TempDir()
	e := &env{ws: filepath.Join(parent, "ws"), out: filepath.Join(parent, "out")}
	must(t, os.Mkdir(e.ws, 0o700))
	uid, gid := testOwner()
	must(t, os.Chown(e.ws, uid, gid))
	must(t, os.MkdirAll(filepath.Join(e.out, "sub"), 0o755))
	for _, p := range []string{"secret", "file.txt", "sub/inner.txt", "sub/secret"} {
		must(t, os.WriteFile(filepath.Join(e.out, p), []byte(sentinel), 0o644))
	}
	e.before = snapshot(t, e.out)
	fsys, err := Open(e.ws, uid, gid, lim)
	must(t, err)
	if viaAgent {
		fsys.Close()
		fsys = OpenRemote(t.Context(), inProcessAgent(e.ws, uid, gid), lim)
	}
	t.Cleanup(func() { fsys.Close() })
	e.fs = fsys
	return e
}

// plantLinks makes the links a hostile sandbox would plant, pointing out of the workspace: relative and
// absolute, to the outside directory and to a sentinel file.
func (e *env) plantLinks(t testing.TB) {
	t.Helper()
	for name, target := range map[string]string{
		"out-rel":     "../out",
		"out-abs":     e.out,
		"secret-rel":  "../out/secret",
		"secret-abs":  filepath.Join(e.out, "secret"),
		"deep-rel":    "../../../../../../../../" + strings.TrimPrefix(e.out, "/"),
		"self-loop":   "self-loop",
		"inside-link": "inside",
	} {
		must(t, os.Symlink(target, filepath.Join(e.ws, name)))
	}
	must(t, os.MkdirAll(filepath.Join(e.ws, "inside"), 0o755))
}

// untouched fails t if anything outside the workspace changed: a name added or removed, content, mode or
// mtime.
func (e *env) untouched(t testing.TB) {
	t.Helper()
	after := snapshot(t, e.out)
	if len(after) != len(e.before) {
		t.Fatalf("the outside directory changed: before %v, after %v", e.before, after)
	}
	for k, v := range e.before {
		if after[k] != v {
			t.Fatalf("outside entry %s changed: %q -> %q", k, v, after[k])
		}
	}
	ents, err := os.ReadDir(filepath.Dir(e.ws))
	must(t, err)
	if len(ents) != 2 {
		t.Fatalf("something was created next to the workspace: %v", ents)
	}
}

// noTemp fails t if an upload left a temporary file in the workspace.
func (e *env) noTemp(t testing.TB) {
	t.Helper()
	_ = filepath.WalkDir(e.ws, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), tempPrefix) {
			t.Errorf("temporary file left behind: %s", p)
		}
		return nil
	})
}

// snapshot describes every entry under dir (test side: the host trusts its own temp dir).
func snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		desc := fi.Mode().String() + " " + fi.ModTime().Format(time.RFC3339Nano)
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += " " + string(b)
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = desc
		return nil
	})
	must(t, err)
	return out
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wantCode fails t unless err carries code.
func wantCode(t testing.TB, err error, code fault.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s", code)
	}
	if !fault.Is(err, code) {
		t.Fatalf("got %v, want %s", err, code)
	}
	var fe *fault.Error
	if errors.As(err, &fe) && fe.Hint == "" {
		t.Errorf("%s error has no hint: %v", code, err)
	}
}

// checkOwner fails t unless the host file p belongs to the test's sandbox user.
func checkOwner(t testing.TB, p string) {
	t.Helper()
	uid, gid := testOwner()
	if uid < 0 {
		return
	}
	fi, err := os.Lstat(p)
	must(t, err)
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != uid || int(st.Gid) != gid {
		t.Errorf("%s is owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, uid, gid)
	}
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// tarEntry is one entry of a tar built by a test.
type tarEntry struct {
	name, link string
	typ        byte
	mode       int64
	body       string
}

func buildTar(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
			if typ == tar.TypeDir {
				mode = 0o755
			}
		}
		size := int64(len(e.body))
		if typ != tar.TypeReg {
			size = 0
		}
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: typ, Mode: mode, Size: size,
			ModTime: time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)}
		must(t, tw.WriteHeader(hdr))
		if typ == tar.TypeReg {
			_, err := io.WriteString(tw, e.body)
			must(t, err)
		}
	}
	must(t, tw.Close())
	return buf.Bytes()
}

// readTar returns the headers of a tar stream and the contents of its files.
func readTar(t testing.TB, b []byte) ([]*tar.Header, map[string]string) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var hdrs []*tar.Header
	bodies := map[string]string{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return hdrs, bodies
		}
		must(t, err)
		hdrs = append(hdrs, hdr)
		if hdr.Typeflag == tar.TypeReg {
			body, err := io.ReadAll(tr)
			must(t, err)
			bodies[hdr.Name] = string(body)
		}
	}
}
