package guard

import (
	"path"
	"strconv"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// FuzzParseMount checks that ParseMount never panics, refuses only with INVALID_MOUNT, and that an accepted
// mount passes CheckMount, has clean absolute paths, and survives a round trip through its canonical form.
func FuzzParseMount(f *testing.F) {
	for _, s := range []string{
		"type=bind,source=/tmp,target=/workspace/tmp,readonly",
		"src=/tmp,dst=/workspace/a,ro",
		"source=/var/run/docker.sock,target=/var/run/docker.sock",
		"source=/home/alice/.ssh,target=/workspace/ssh",
		"type=volume,source=data,target=/data",
		"type=tmpfs,target=/workspace/t",
		"source=/tmp,target=/workspace/a,readonly=0",
		"source=/tmp/../etc,target=/workspace/a",
		"source=/tmp,src=/tmp,target=/workspace/a",
		"source=/proc/self/root,target=/workspace/a",
		"",
		",",
		"=",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMount(s)
		if err != nil {
			if !fault.Is(err, fault.InvalidMount) {
				t.Fatalf("ParseMount(%q) error %v is not INVALID_MOUNT", s, err)
			}
			return
		}
		for _, p := range []string{m.Source, m.Target} {
			if !path.IsAbs(p) || path.Clean(p) != p || badChar(p) != "" {
				t.Fatalf("ParseMount(%q) accepted path %q", s, p)
			}
		}
		if err := CheckMount(m); err != nil {
			t.Fatalf("ParseMount(%q) accepted %+v, which CheckMount refuses: %v", s, m, err)
		}
		canon := "type=bind,source=" + m.Source + ",target=" + m.Target + ",readonly=" + strconv.FormatBool(m.ReadOnly)
		if again, err := ParseMount(canon); err != nil || again != m {
			t.Fatalf("round trip of %q via %q = %+v, %v; want %+v", s, canon, again, err, m)
		}
	})
}

// FuzzWorkdir checks that Workdir never panics, refuses only with INVALID_WORKDIR, and that an accepted result
// is /workspace or beneath it, clean, free of "..", and a fixed point.
func FuzzWorkdir(f *testing.F) {
	for _, s := range []string{"", ".", "src/app", "/workspace", "/workspace/", "../etc", "/proc/self/cwd", "-x", "a\x00b", "//workspace//a/./b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dir string) {
		out, err := Workdir(dir)
		if err != nil {
			if !fault.Is(err, fault.InvalidWorkdir) {
				t.Fatalf("Workdir(%q) error %v is not INVALID_WORKDIR", dir, err)
			}
			return
		}
		checkWorkdirOutput(t, dir, out)
	})
}

// FuzzEnv checks that EnvVar and Env never panic, agree with each other, refuse only with INVALID_ENV, never
// print the value, and accept only names and values within the rules. The value is marked with a \x01 byte:
// messages quote names with %q, so a raw \x01 in a message can only have come from the value.
func FuzzEnv(f *testing.F) {
	for _, kv := range [][2]string{{"A", "1"}, {"", "x"}, {"A=B", "c"}, {"A\nB", "c"}, {"K", "a\x00b"}, {"ÉTAT", "ok"}} {
		f.Add(kv[0], kv[1])
	}
	f.Fuzz(func(t *testing.T, name, value string) {
		value = "\x01" + value
		err := EnvVar(name, value)
		if (err == nil) != validEnv(name, value) {
			t.Fatalf("EnvVar(%q, %q) = %v, disagrees with the rules", name, value, err)
		}
		if err != nil && (!fault.Is(err, fault.InvalidEnv) || strings.Contains(err.Error(), value)) {
			t.Fatalf("EnvVar(%q) error %q is not INVALID_ENV or leaks the value", name, err)
		}
		if !strings.Contains(name, "=") {
			if envErr := Env([]string{name + "=" + value}); (envErr == nil) != (err == nil) {
				t.Fatalf("Env and EnvVar disagree on %q: %v vs %v", name, envErr, err)
			}
		}
	})
}

// validEnv restates the env rules independently of the code under test.
func validEnv(name, value string) bool {
	if name == "" || len(name) > MaxEnvNameLen || strings.ContainsAny(name, "=\x00\r\n") || badChar(name) != "" {
		return false
	}
	return len(value) <= MaxEnvValueLen && !strings.Contains(value, "\x00")
}
