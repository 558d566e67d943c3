package build

import (
	"path"
	"strings"
	"testing"
)

func TestIgnore(t *testing.T) {
	tests := []struct {
		name     string
		patterns string
		excluded []string
		included []string
	}{
		{"empty", "", nil, []string{"a", "a/b"}},
		{"comments and blanks", "# a\n\n   \n#b\n", nil, []string{"a", "#b"}},
		{"literal file", "secret.txt", []string{"secret.txt"}, []string{"a/secret.txt", "secret.txt.bak"}},
		{"anchored with slash", "/secret.txt", []string{"secret.txt"}, []string{"a/secret.txt"}},
		{"directory excludes children", "node_modules", []string{"node_modules", "node_modules/x/y"}, []string{"a/node_modules"}},
		{"trailing slash", "build/", []string{"build", "build/out"}, []string{"builder"}},
		{"star one level", "*.log", []string{"a.log", "a.log/inner"}, []string{"d/a.log"}},
		{"star in dir", "*/tmp", []string{"a/tmp", "a/tmp/x"}, []string{"tmp", "a/b/tmp"}},
		{"double star any depth", "**/*.log", []string{"a.log", "d/a.log", "d/e/f/a.log"}, []string{"a.txt"}},
		{"double star middle", "a/**/z", []string{"a/z", "a/b/z", "a/b/c/z/q"}, []string{"z", "b/a/z"}},
		{"double star end", "a/**", []string{"a", "a/b", "a/b/c"}, []string{"b"}},
		{"double star alone", "**", []string{"a", "a/b"}, nil},
		{"question and class", "f?[0-9]", []string{"fa1", "fb9/x"}, []string{"f1", "fab", "fa10"}},
		{"escape", `\*`, []string{"*"}, []string{"a"}},
		{"exception", "*.md\n!README.md", []string{"a.md"}, []string{"README.md"}},
		{"exception inside excluded dir", "docs\n!docs/keep", []string{"docs", "docs/x"}, []string{"docs/keep", "docs/keep/y"}},
		{"last match wins", "!a\na", []string{"a"}, nil},
		{"re-exclude", "*\n!src\nsrc/gen", []string{"x", "src/gen/a"}, []string{"src", "src/main.go"}},
		{"cleaned pattern", "./a/../b//c/", []string{"b/c", "b/c/d"}, []string{"a", "b"}},
		{"whitespace trimmed", "  a  \n\t!  a/b ", []string{"a", "a/c"}, []string{"a/b"}},
		{"hash not first is a pattern", " #x", []string{"#x"}, nil},
		{"bom", "\uFEFFa", []string{"a"}, nil},
		{"crlf", "a\r\nb\r\n", []string{"a", "b"}, []string{"c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ig, err := parseIgnore([]byte(tt.patterns))
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			for _, p := range tt.excluded {
				if !ig.excluded(p) {
					t.Errorf("%q is not excluded", p)
				}
			}
			for _, p := range tt.included {
				if ig.excluded(p) {
					t.Errorf("%q is excluded", p)
				}
			}
		})
	}
}

func TestIgnoreRefused(t *testing.T) {
	tests := []struct {
		name, patterns, want string
	}{
		{"bare bang", "a\n!", "line 2"},
		{"bang space", "! ", "'!' with no pattern"},
		{"context itself", ".", "names the context itself"},
		{"root", "/", "names the context itself"},
		{"parent", "../x", "outside the context"},
		{"parent after clean", "a/../../x", "outside the context"},
		{"bad class", "[a", "syntax error in pattern"},
		{"bad escape", `a\`, "syntax error in pattern"},
		{"too long a line", strings.Repeat("a", MaxIgnoreBytes+2), "too long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseIgnore([]byte(tt.patterns))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

// TestIgnoreManyDoubleStars: matching is linear in pattern and path, not exponential in the number of `**`.
func TestIgnoreManyDoubleStars(t *testing.T) {
	ig, err := parseIgnore([]byte(strings.Repeat("**/", 200) + "x"))
	if err != nil {
		t.Fatal(err)
	}
	p := strings.Repeat("d/", 500) + "y"
	if ig.excluded(p) {
		t.Fatalf("excluded %q", p)
	}
	if !ig.excluded(strings.Repeat("d/", 500) + "x") {
		t.Fatal("not excluded")
	}
}

// escapeLiteral turns a path into a pattern that matches exactly it.
func escapeLiteral(p string) string {
	var b strings.Builder
	for i := range len(p) { // bytes, not runes: invalid UTF-8 stays as it is
		if strings.IndexByte(`*?[]\`, p[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

// FuzzIgnore: parsing never panics; a parsed file decides deterministically; without exceptions an excluded
// directory excludes what is under it; a literal pattern for a path excludes it and its children, and a later
// `!` literal re-includes it.
func FuzzIgnore(f *testing.F) {
	f.Add("*.log\n!keep.log", "keep.log")
	f.Add("**/node_modules", "a/node_modules/b")
	f.Add("a/**/b\n# c\n", "a/x/y/b")
	f.Add("[a-", "a")
	f.Add("!", "x")
	f.Add("\uFEFF/x/", "x/y")
	f.Fuzz(func(t *testing.T, patterns, p string) {
		if len(patterns) > 4096 || len(p) > 512 {
			return
		}
		ig, err := parseIgnore([]byte(patterns))
		if err != nil {
			return
		}
		for _, r := range ig.rules {
			for _, e := range r.elems {
				if e == ".." || e == "" {
					t.Fatalf("accepted rule element %q in %q", e, patterns)
				}
			}
		}
		p = path.Clean(p)
		if p == "." || p == ".." || strings.HasPrefix(p, "../") || strings.HasPrefix(p, "/") {
			return
		}
		got := ig.excluded(p)
		if got != ig.excluded(p) {
			t.Fatal("excluded is not deterministic")
		}
		if got && !ig.hasExceptions && !ig.excluded(p+"/child") {
			t.Fatalf("%q excluded but %q/child is not (patterns %q)", p, p, patterns)
		}
		lit := escapeLiteral(p)
		if strings.ContainsAny(p, "\n\r") || strings.TrimSpace(lit) != lit || strings.HasPrefix(lit, "#") || strings.HasPrefix(lit, "!") {
			return // not expressible as one literal line
		}
		with, err := parseIgnore([]byte(patterns + "\n" + lit))
		if err != nil {
			t.Fatalf("literal %q refused: %v", lit, err)
		}
		if !with.excluded(p) || !with.excluded(p+"/child") {
			t.Fatalf("literal %q does not exclude %q and its children", lit, p)
		}
		back, err := parseIgnore([]byte(patterns + "\n" + lit + "\n!" + lit))
		if err != nil {
			t.Fatalf("exception %q refused: %v", lit, err)
		}
		if back.excluded(p) {
			t.Fatalf("!%q does not re-include %q", lit, p)
		}
	})
}
