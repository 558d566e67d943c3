package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/sandkeep/sandkeep"

// goList runs `go list` with args and returns its lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// TestCLIReachesTheEngineThroughTheLibrary: the CLI drives sandboxes through the public API (sandkeep, drivers,
// stores, client) and the server packages it owns, never through the engine's packages (docs/ARCHITECTURE.md,
// issue 26): `go list -deps ./cmd/sandkeep` names no internal/lifecycle, cmd/sandkeep imports nothing under
// internal/engine, and the lifecycle is imported by the engine alone (outside tests), so no entry point can
// climb around admission into it.
func TestCLIReachesTheEngineThroughTheLibrary(t *testing.T) {
	for _, p := range goList(t, "-deps", module+"/cmd/sandkeep") {
		if strings.HasPrefix(p, module+"/internal/lifecycle") {
			t.Errorf("cmd/sandkeep depends on %s", p)
		}
	}
	for _, line := range goList(t, "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"/...") {
		pkg, imports, _ := strings.Cut(line, " ")
		for _, imp := range strings.Fields(imports) {
			switch {
			case strings.HasPrefix(pkg, module+"/cmd/sandkeep") && strings.HasPrefix(imp, module+"/internal/engine"):
				t.Errorf("%s imports %s: use the sandkeep package", pkg, imp)
			case imp == module+"/internal/engine/lifecycle" && pkg != module+"/internal/engine" &&
				!strings.HasPrefix(pkg, module+"/internal/engine/"):
				t.Errorf("%s imports the lifecycle: only the engine may", pkg)
			}
		}
	}
}

// TestRootPackageReadsInOneSitting: the root package is the public API a library user reads in one sitting
// (docs/ARCHITECTURE.md, issue 26): at most 900 lines of non-test Go, and no exported alias of an internal type
// beyond the few values every layer passes through (each named in ARCHITECTURE.md with why). Processes,
// snapshots, forks and warm pools have packages of their own.
func TestRootPackageReadsInOneSitting(t *testing.T) {
	allowed := map[string]bool{"Key": true, "Error": true, "Code": true, "Store": true, "RepositoryPolicy": true,
		"Files": true, "FileLimits": true, "WindowSize": true}
	names, err := filepath.Glob(filepath.Join("..", "..", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	lines, fset := 0, token.NewFileSet()
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		lines += bytes.Count(src, []byte("\n"))
		f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		internal := map[string]bool{} // local names of the file's internal imports
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.Contains(path, "/internal/") {
				local := path[strings.LastIndex(path, "/")+1:]
				if imp.Name != nil {
					local = imp.Name.Name
				}
				internal[local] = true
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || !ts.Assign.IsValid() || !ts.Name.IsExported() {
				return true
			}
			if sel, ok := ts.Type.(*ast.SelectorExpr); ok {
				if x, ok := sel.X.(*ast.Ident); ok && internal[x.Name] && !allowed[ts.Name.Name] {
					t.Errorf("%s: %s is an alias of an internal type (%s.%s): declare a public type", fset.Position(ts.Pos()), ts.Name.Name, x.Name, sel.Sel.Name)
				}
			}
			return true
		})
	}
	if lines == 0 || lines > 900 {
		t.Errorf("the root package holds %d lines of non-test Go; the bar is 900", lines)
	}
}
