package main

import (
	"os/exec"
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
