package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/cmd/sandkeep/internal/fastpath"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// helloOf is the Hello a fuzz input names: the control word, the arguments (NUL-separated) and the fingerprint.
func helloOf(control, args, fp string) fastpath.Hello {
	h := fastpath.Hello{Control: control, Fingerprint: fp}
	if args != "" {
		h.Args = strings.Split(args, "\x00")
	}
	return h
}

// FuzzHelloMarshal: the fast path's hand-written JSON of a call's first frame is encoding/json's, byte for byte,
// for any arguments (invalid UTF-8, control characters, HTML characters, U+2028 included), and the daemon reads
// back what was sent.
func FuzzHelloMarshal(f *testing.F) {
	f.Add("", "exec\x00--user\x00u\x00--\x00true", "0123456789abcdef0123456789abcdef")
	f.Add("status", "", "")
	f.Add("", "exec\x00--\x00sh\x00-c\x00echo \"<a&b>\" \\ \t\n\r\b\f\x01\x1f\x7f", "fp")
	f.Add("", "exec\x00--\x00printf\x00\xff\xfe\xc3\x28\xe2\x80\xa8\xe2\x80\xa9 é 日本 🙂", "")
	f.Add("stop", "\x00\x00", "x")
	f.Fuzz(func(t *testing.T, control, args, fp string) {
		h := helloOf(control, args, fp)
		want, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		got := h.Marshal()
		if !bytes.Equal(got, want) {
			t.Fatalf("Marshal of %+q:\n got %s\nwant %s", h, got, want)
		}
		var back fastpath.Hello
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("the daemon cannot read %s: %v", got, err)
		}
	})
}

// TestFastPathImports: the fast path's package imports the standard library only (and internal/homedir), and
// none of the packages whose imports would hold its init back behind the binary's heavy ones (encoding/json,
// fmt and reflect; crypto's FIPS packages): docs/DAEMON.md, "The fast path".
func TestFastPathImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}",
		"github.com/sandkeep/sandkeep/cmd/sandkeep/internal/fastpath").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	ours := map[string]bool{
		"github.com/sandkeep/sandkeep/internal/homedir":               true,
		"github.com/sandkeep/sandkeep/cmd/sandkeep/internal/fastpath": true,
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, std, _ := strings.Cut(line, " ")
		if std != "true" && !ours[path] {
			t.Errorf("the fast path imports %s, which is not the standard library", path)
		}
		if path == "encoding/json" || path == "fmt" || path == "reflect" || path == "encoding/binary" ||
			strings.HasPrefix(path, "crypto/") {
			t.Errorf("the fast path imports %s", path)
		}
	}
}

// TestFastPathFailure: the fast path's typed error carries internal/fault's code for a lost daemon and reads as
// fault's error does; cmd/sandkeep turns it into a fault.Error with the same code, message, hint and cause.
func TestFastPathFailure(t *testing.T) {
	if fastpath.LostCode != string(fault.DaemonLost) {
		t.Fatalf("fastpath.LostCode %q, fault.DaemonLost %q", fastpath.LostCode, fault.DaemonLost)
	}
	cause := errors.New("read: connection reset by peer")
	f := fastpath.Lost(cause)
	fe := fault.Wrap(cause, fault.DaemonLost, f.Hint, "the daemon went away during the call: %v", cause)
	if f.Error() != fe.Error() {
		t.Fatalf("fastpath %q, fault %q", f.Error(), fe.Error())
	}
	var got *fault.Error
	if err := fromFastPath(f); !errors.As(err, &got) || got.Code != fault.DaemonLost || got.Message != fe.Message ||
		got.Hint != fe.Hint || !errors.Is(err, cause) {
		t.Fatalf("fromFastPath: %#v", err)
	}
	// The fast path's own callers (the relay) see the cause through it, as through fault's error.
	if f.Unwrap() != cause || !errors.Is(f, cause) {
		t.Fatalf("the fast path's failure hides its cause: %v", f.Unwrap())
	}
	var b bytes.Buffer
	fastpath.PrintError(&b, "DAEMON_LOST", "two\nlines", "a\r\nhint")
	if want := "sandkeep: DAEMON_LOST: two lines\nhint: a hint\n"; b.String() != want {
		t.Fatalf("PrintError wrote %q, want %q", b.String(), want)
	}
}
