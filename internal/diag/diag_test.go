package diag

import (
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"strconv"
	"testing"
)

// TestCodes reads this package's source: every Code constant is SKnnn, unique, and documented on its line.
func TestCodes(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	form := regexp.MustCompile(`^SK\d{3}$`)
	seen := map[string]string{}
	for _, pkg := range pkgs {
		for name, file := range pkg.Files {
			if name == "diag_test.go" {
				continue
			}
			for _, decl := range file.Decls {
				gd, ok := decl.(*ast.GenDecl)
				if !ok || gd.Tok != token.CONST {
					continue
				}
				for _, spec := range gd.Specs {
					vs := spec.(*ast.ValueSpec)
					if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
						continue
					}
					for i, n := range vs.Names {
						lit, ok := vs.Values[i].(*ast.BasicLit)
						if !ok {
							t.Errorf("%s: not a literal", n.Name)
							continue
						}
						v, _ := strconv.Unquote(lit.Value)
						switch {
						case !form.MatchString(v):
							t.Errorf("%s = %q: want SKnnn", n.Name, v)
						case seen[v] != "":
							t.Errorf("%s = %q: already the value of %s", n.Name, v, seen[v])
						case vs.Comment == nil || vs.Comment.Text() == "":
							t.Errorf("%s = %q: no comment on its line says what it means", n.Name, v)
						}
						seen[v] = n.Name
					}
				}
			}
		}
	}
	if len(seen) == 0 {
		t.Fatal("found no codes")
	}
}

func TestString(t *testing.T) {
	tests := []struct {
		d    Diagnostic
		want string
	}{
		{Diagnostic{Code: "SK101", Severity: Error, File: "s.yaml", Line: 3, Column: 9, Message: "m", Hint: "h"}, "s.yaml:3:9: SK101 error: m (hint: h)"},
		{Diagnostic{Code: "SK112", Severity: Warning, File: "s.yaml", Line: 3, Message: "m"}, "s.yaml:3: SK112 warning: m"},
		{Diagnostic{Code: "SK100", Severity: Error, File: "s.yaml", Message: "m"}, "s.yaml: SK100 error: m"},
		{Diagnostic{Code: "SK301", Severity: Error, Message: "m"}, "SK301 error: m"},
		{Diagnostic{Code: "SK501", Severity: Error, File: "s.yaml", Line: 2, Column: 3, Message: "m", Hint: "h", Tier: "repository", Field: "sandbox.user"},
			"s.yaml:2:3: SK501 error: m [tier repository, field sandbox.user] (hint: h)"},
		{Diagnostic{Code: "SK511", Severity: Error, Message: "m", Tier: "operator"}, "SK511 error: m [tier operator]"},
		{Diagnostic{Code: "SK511", Severity: Error, Message: "m", Field: "secrets.x"}, "SK511 error: m [field secrets.x]"},
	}
	for _, tt := range tests {
		if got := tt.d.String(); got != tt.want {
			t.Errorf("String() = %q; want %q", got, tt.want)
		}
	}
	warn := List{{Code: "SK112", Severity: Warning, Message: "w"}}
	if warn.HasErrors() || warn.Err() != nil {
		t.Error("a list of warnings is an error")
	}
	both := append(warn, Diagnostic{Code: "SK101", Severity: Error, Message: "e"})
	if err := both.Err(); err == nil || err.Error() != "SK112 warning: w\nSK101 error: e" {
		t.Errorf("Err() = %v", err)
	}
}
