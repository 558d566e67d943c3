package spec

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/diag"
)

// FuzzParse checks that Parse never panics; that every diagnostic has a spec or rule code, a message, a hint,
// the file and (except for file-level problems) a line; that a file comes back exactly when there are no
// errors; and that an accepted spec passes Validate, which runs the same checks without positions.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/TestParse/*/*.yaml")
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("sandbox: {mode: auto, image: debian:12}"))
	f.Add([]byte("sandbox:\n  env:\n    ? [a]\n    : b\n"))
	f.Add([]byte("sandbox: !!map {image: !!str 12}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		const name = "sandkeep.yaml"
		file, list := Parse(name, data)
		for _, d := range list {
			code := string(d.Code)
			if !strings.HasPrefix(code, "SK1") && !strings.HasPrefix(code, "SK3") || d.Message == "" || d.Hint == "" || d.File != name {
				t.Fatalf("diagnostic %+v: want an SK1xx/SK3xx code, a message, a hint and the file", d)
			}
			if d.Line <= 0 && d.Code != diag.SpecFile {
				t.Fatalf("diagnostic %v has no line", d)
			}
			if d.Severity != diag.Error && d.Severity != diag.Warning {
				t.Fatalf("diagnostic %v has severity %q", d, d.Severity)
			}
		}
		if (file == nil) != list.HasErrors() {
			t.Fatalf("Parse returned file %v with errors %v", file != nil, list.HasErrors())
		}
		if file == nil {
			return
		}
		if errs := file.Sandbox.Validate(); errs.HasErrors() {
			t.Fatalf("Parse accepted a spec that Validate refuses: %v\n%q", diag.ListError(errs), data)
		}
	})
}
