package guard

import (
	"path"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
	"pgregory.net/rapid"
)

func TestWorkdir(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string // the resolved path when err is ""
		err  string
	}{
		{"empty", "", "/workspace", ""},
		{"dot", ".", "/workspace", ""},
		{"relative", "src/app", "/workspace/src/app", ""},
		{"relative dot slash", "./src/app/", "/workspace/src/app", ""},
		{"absolute workspace", "/workspace", "/workspace", ""},
		{"absolute workspace slash", "/workspace/", "/workspace", ""},
		{"absolute under", "/workspace/src", "/workspace/src", ""},
		{"absolute unclean", "/workspace//src/./app", "/workspace/src/app", ""},
		{"dash inside", "src/-x", "/workspace/src/-x", ""},
		{"unicode", "données/项目", "/workspace/données/项目", ""},
		{"procfs like name", "processor", "/workspace/processor", ""},
		{"max length", strings.Repeat("a", MaxWorkdirLen-len("/workspace/")), "/workspace/" + strings.Repeat("a", MaxWorkdirLen-len("/workspace/")), ""},
		{"outside", "/etc", "", "outside /workspace"},
		{"root", "/", "", "outside /workspace"},
		{"sibling prefix", "/workspaces", "", "outside /workspace"},
		{"dotdot escape", "../etc", "", "'..'"},
		{"dotdot inside", "src/../app", "", "'..'"},
		{"dotdot absolute", "/workspace/../workspace", "", "'..'"},
		{"proc absolute", "/proc/self/cwd", "", "'proc'"},
		{"proc under workspace", "/workspace/proc/1/root", "", "'proc'"},
		{"proc relative", "proc/self", "", "'proc'"},
		{"nul", "src\x00", "", "NUL"},
		{"newline", "src\n", "", "control character"},
		{"tab", "a\tb", "", "control character"},
		{"del", "a\x7f", "", "control character"},
		{"c1", "a\u0085", "", "control character"},
		{"invalid utf8", "a\xff", "", "UTF-8"},
		{"leading dash", "-rf", "", "starts with '-'"},
		{"too long input", strings.Repeat("./", MaxWorkdirLen/2+1), "", "over the limit"},
		{"too long resolved", strings.Repeat("a", MaxWorkdirLen-len("/workspace/")+1), "", "over the limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Workdir(tt.in)
			if tt.err != "" {
				wantFault(t, err, fault.InvalidWorkdir, tt.err)
				if fe := err.(*fault.Error); fe.Hint != workdirHint {
					t.Errorf("hint = %q, want %q", fe.Hint, workdirHint)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Workdir(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

// checkWorkdirOutput fails t unless out is an acceptable result of Workdir: /workspace or beneath it, clean,
// without a ".." component, and a fixed point of Workdir.
func checkWorkdirOutput(t interface{ Fatalf(string, ...any) }, in, out string) {
	if out != "/workspace" && !strings.HasPrefix(out, "/workspace/") {
		t.Fatalf("Workdir(%q) = %q, not under /workspace", in, out)
	}
	if path.Clean(out) != out {
		t.Fatalf("Workdir(%q) = %q, not clean", in, out)
	}
	for _, n := range strings.Split(out, "/") {
		if n == ".." {
			t.Fatalf("Workdir(%q) = %q, has a '..' component", in, out)
		}
	}
	again, err := Workdir(out)
	if err != nil || again != out {
		t.Fatalf("Workdir(Workdir(%q)) = %q, %v; want %q", in, again, err, out)
	}
}

// workdirGen builds paths from names chosen to hit the rules: traversal, proc, the workspace itself, empty
// and dot names, control characters, a leading dash.
func workdirGen() *rapid.Generator[string] {
	name := rapid.OneOf(
		rapid.SampledFrom([]string{"", ".", "..", "...", "proc", "workspace", "-x", "a\x00", "b\n", "é", "src", "/"}),
		rapid.StringMatching(`[a-z.\-]{1,6}`),
		rapid.String(),
	)
	prefix := rapid.SampledFrom([]string{"", "/", "/workspace/", "./", "//workspace/"})
	return rapid.Custom(func(t *rapid.T) string {
		return prefix.Draw(t, "prefix") + strings.Join(rapid.SliceOfN(name, 0, 8).Draw(t, "names"), "/")
	})
}

func TestWorkdirProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := workdirGen().Draw(t, "dir")
		out, err := Workdir(in)
		if err != nil {
			if !fault.Is(err, fault.InvalidWorkdir) {
				t.Fatalf("Workdir(%q) error %v is not INVALID_WORKDIR", in, err)
			}
			return
		}
		checkWorkdirOutput(t, in, out)
	})
}

// TestWorkdirIn: with a devcontainer.json's workspace folder, "" and relative paths resolve under it, absolute
// paths under it or under /workspace (the same directory) are accepted, anything else is refused.
func TestWorkdirIn(t *testing.T) {
	const folder = "/workspaces/app"
	tests := []struct{ dir, want string }{
		{"", folder},
		{"src", folder + "/src"},
		{folder, folder},
		{folder + "/src", folder + "/src"},
		{"/workspace/src", "/workspace/src"},
		{"/workspaces/other", ""},
		{"/workspaces", ""},
		{"/workspaces/app/../other", ""},
		{"/etc", ""},
		{"/workspaces/appx", ""},
	}
	for _, tt := range tests {
		got, err := WorkdirIn(folder, tt.dir)
		if tt.want == "" {
			if fault.CodeOf(err) != fault.InvalidWorkdir {
				t.Errorf("WorkdirIn(%q) = %q, %v; want INVALID_WORKDIR", tt.dir, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("WorkdirIn(%q) = %q, %v; want %q", tt.dir, got, err, tt.want)
		}
	}
	if got, err := WorkdirIn("", ""); err != nil || got != "/workspace" {
		t.Errorf("WorkdirIn without a folder = %q, %v", got, err)
	}
	for _, dir := range []string{"../x", "/proc/self", "-rf"} {
		if err := WorkdirText(dir); fault.CodeOf(err) != fault.InvalidWorkdir {
			t.Errorf("WorkdirText(%q) = %v, want INVALID_WORKDIR", dir, err)
		}
	}
	if err := WorkdirText("/workspaces/app/src"); err != nil {
		t.Errorf("WorkdirText of an absolute path: %v (where it lies is WorkdirIn's)", err)
	}
}
