package homedir

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzPaths: Clean, Join, IsAbs and Abs are path/filepath's on Unix, for any input.
func FuzzPaths(f *testing.F) {
	for _, s := range []string{"", ".", "..", "/", "//", "a/b/../c", "/a/./b/", "../../x", "a/..", "/..", "a//b", "./a/", "/a/b/../../.."} {
		f.Add(s, "sandkeep")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if got, want := Clean(a), filepath.Clean(a); got != want {
			t.Fatalf("Clean(%q) = %q, filepath.Clean: %q", a, got, want)
		}
		if got, want := Join(a, b), filepath.Join(a, b); got != want {
			t.Fatalf("Join(%q, %q) = %q, filepath.Join: %q", a, b, got, want)
		}
		if IsAbs(a) != filepath.IsAbs(a) {
			t.Fatalf("IsAbs(%q)", a)
		}
		got, err := Abs(a)
		want, werr := filepath.Abs(a)
		if got != want || (err == nil) != (werr == nil) {
			t.Fatalf("Abs(%q) = %q, %v; filepath.Abs: %q, %v", a, got, err, want, werr)
		}
	})
}

func TestDefault(t *testing.T) {
	if os.Geteuid() == 0 {
		if Default() != "/var/lib/sandkeep" {
			t.Fatalf("root's default home is %q", Default())
		}
		return
	}
	t.Setenv("XDG_STATE_HOME", "/x/state/")
	if got := Default(); got != "/x/state/sandkeep" {
		t.Fatalf("Default() = %q", got)
	}
}
