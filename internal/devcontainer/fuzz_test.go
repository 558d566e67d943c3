package devcontainer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/guard"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// maxFuzzInput bounds one fuzz input: large enough for every real file, small enough to keep runs fast.
const maxFuzzInput = 64 << 10

// FuzzParse checks that Parse never panics and keeps its contract on any input: a Config exactly when there
// are no errors, SK2xx codes only, positions inside the file, mounts that pass the guard, no deny-class host
// value in the output, and a Fuse that never panics or reports a value. Seeds: testdata/TestRealWorld and
// testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	files, err := filepath.Glob("testdata/TestRealWorld/*/.devcontainer*")
	if err != nil {
		f.Fatal(err)
	}
	corpus, err := filepath.Glob("testdata/TestCorpus/*/.devcontainer")
	if err != nil {
		f.Fatal(err)
	}
	files = append(files, corpus...)
	for _, p := range files {
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			p = filepath.Join(p, "devcontainer.json")
		}
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	ws := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxFuzzInput {
			t.Skip()
		}
		cfg, list := Parse(filepath.Join(ws, ".devcontainer", "devcontainer.json"), data, hostEnv(ws, defaultVars))
		if (cfg == nil) != list.HasErrors() {
			t.Fatalf("cfg nil = %v, HasErrors = %v", cfg == nil, list.HasErrors())
		}
		if len(list) > maxDiags+1 {
			t.Fatalf("%d diagnostics", len(list))
		}
		lines := strings.Count(string(data), "\n") + 2
		for _, d := range list {
			if !strings.HasPrefix(string(d.Code), "SK2") || d.Message == "" || (d.Severity != diag.Error && d.Severity != diag.Warning) {
				t.Fatalf("bad diagnostic %#v", d)
			}
			if d.Line < 0 || d.Line > lines || d.Column < 0 {
				t.Fatalf("position %d:%d outside a file of %d lines", d.Line, d.Column, lines)
			}
			if strings.Contains(d.String(), sentinel) {
				t.Fatalf("diagnostic carries a deny-class host value: %s", d)
			}
		}
		if cfg == nil {
			return
		}
		for _, e := range cfg.ForwardPorts { // what port forwarding reads of each entry: a port or an error
			if fp, err := ParseForwardPort(e); err == nil && (fp.Port < 1 || fp.Port > 65535) {
				t.Fatalf("forwardPorts %q read as port %d", e, fp.Port)
			}
		}
		if cfg.Image != "" && cfg.Build != nil {
			t.Fatalf("image and build both set: %+v", cfg)
		}
		drops := 0
		for _, d := range list {
			if d.Code == diag.DevcontainerDropped {
				if d.Severity != diag.Warning {
					t.Fatalf("a drop fails the file: %s", d)
				}
				drops++
			}
		}
		if len(cfg.Dropped) > maxDiags || (len(list) <= maxDiags && drops != len(cfg.Dropped)) {
			t.Fatalf("%d drops, %d SK202 warnings", len(cfg.Dropped), drops)
		}
		for _, d := range cfg.Dropped {
			if d.Field == "" || d.Why == "" || len(d.Item) > maxItem+len("…") {
				t.Fatalf("bad drop %+v", d)
			}
		}
		for _, v := range cfg.Volumes {
			if why := scratchTarget(v.Target, "/workspace"); why != "" && !strings.HasPrefix(why, "is the workspace") {
				t.Fatalf("volume %+v passed Parse: %s", v, why)
			}
			if v.Name != "" && !namedVolume.MatchString(v.Name) {
				t.Fatalf("volume name %q passed Parse", v.Name)
			}
		}
		for _, c := range []string{cfg.OnCreate, cfg.UpdateContent, cfg.PostCreate, cfg.PostStart, cfg.PostAttach} {
			if badCommand(c) {
				t.Fatalf("lifecycle command with control characters passed Parse: %q", c)
			}
		}
		for _, m := range cfg.Mounts {
			if _, err := guard.ParseMount(m); err != nil {
				t.Fatalf("mount %q passed Parse but not the guard: %v", m, err)
			}
		}
		b, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), sentinel) {
			t.Fatalf("config carries a deny-class host value: %s", b)
		}
		sb, events := Fuse(cfg, &spec.Sandbox{Env: map[string]string{"K": "spec"}}, &spec.Sandbox{User: "1000:1000"})
		if sb.User != "1000:1000" || sb.Env["K"] != "spec" {
			t.Fatalf("fused %+v", sb)
		}
		for _, e := range events {
			if e.Kind != EventEnvDenied || DenyClass(e.Key) != e.Class || e.Class == "" {
				t.Fatalf("bad event %+v", e)
			}
			if _, kept := sb.Env[e.Key]; kept {
				t.Fatalf("denied key %s kept", e.Key)
			}
		}
		for k := range cfg.Env {
			if DenyClass(k) == "" && k != "K" && sb.Env[k] != cfg.Env[k] {
				t.Fatalf("env %s lost", k)
			}
		}
	})
}
