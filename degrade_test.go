package sandkeep_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/testutil"
	"github.com/sandkeep/sandkeep/internal/tier"
)

// unreachableDocker offers a Docker driver at a socket that does not exist: no sandboxing driver is usable.
func unreachableDocker() sandkeep.DriverOption {
	return sandkeep.DriverOption{Name: sandkeep.DriverDocker, New: func(sandkeep.DriverEnv) (sandkeep.Driver, error) {
		return docker.New(docker.Options{Host: "unix:///nonexistent/sandkeep-test/docker.sock"})
	}}
}

// degradeConfig is a Config whose only usable driver is the host passthrough, with a store, a repository spec
// that builds its image, and a template with a secret file.
func degradeConfig(t *testing.T) sandkeep.Config {
	t.Helper()
	repo := t.TempDir()
	os.WriteFile(filepath.Join(repo, "Dockerfile"), []byte("FROM scratch\n"), 0o644)
	os.WriteFile(filepath.Join(repo, "sandkeep.yaml"), []byte("sandbox:\n  build: {dockerfile: Dockerfile}\n"), 0o644)
	secret := filepath.Join(t.TempDir(), "npmrc")
	os.WriteFile(secret, []byte("s3cret"), 0o600)
	cfg := sandkeep.Config{
		Home:      t.TempDir(),
		AgentPath: testutil.AgentBinary(t),
		Drivers:   []sandkeep.DriverOption{unreachableDocker(), sandkeep.HostDriver()},
		Spec:      filepath.Join(repo, "sandkeep.yaml"),
		Templates: map[string]sandkeep.Template{"withsecret": {
			Secrets: []sandkeep.TemplateSecret{{Name: "npmrc", Path: "/run/secrets/npmrc"}}}},
		Repository: sandkeep.RepositoryPolicy{Secrets: map[string]tier.SecretSource{"npmrc": {FromFile: secret}}},
	}
	return withStore(t, cfg, filepath.Join(t.TempDir(), "runs.db"))
}

// TestDegradedRunProceeds: an auto run degraded to the host proceeds unsandboxed exactly as its sandbox_skipped
// says: the spec's build is not attempted (no SPEC_UNSUPPORTED), the template's secret files are dropped and
// reported (file_secrets_dropped true, no SECRET_DELIVERY_FAILED, no sandbox_recycled). An explicit none with
// secret files is refused with SECRETS_NEED_SANDBOX, recorded as such.
func TestDegradedRunProceeds(t *testing.T) {
	t.Parallel()
	cfg := degradeConfig(t)
	m, err := sandkeep.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	key := sandkeep.Key{Tenant: "acme", User: "degraded"}
	var seen []string
	run, err := m.Admit(t.Context(), sandkeep.RunRequest{Key: key, Mode: "auto", Template: "withsecret",
		OnEvent: func(name string, _ any) { seen = append(seen, name) }})
	if err != nil {
		t.Fatalf("a degraded run with a build and a template's secret files: %v", err)
	}
	res, err := run.Exec(t.Context(), sandkeep.ExecRequest{Argv: []string{"sh", "-c", "echo on-host; test -e /run/secrets/npmrc && echo LEAK; true"}})
	run.Finish(err)
	if err != nil || string(res.Stdout) != "on-host\n" {
		t.Fatalf("exec: %v, %+v", err, res)
	}
	if run.Driver != "host" || run.Notice == "" {
		t.Errorf("run: %+v", run)
	}
	st := cfg.Store
	row, _ := st.GetRun(t.Context(), run.ID)
	if row.Status != store.StatusSucceeded || row.Driver != "host" {
		t.Errorf("run row: %+v", row)
	}
	evs, _ := st.ListEvents(t.Context(), store.EventFilter{RunID: run.ID})
	var names []string
	for _, e := range evs {
		names = append(names, e.Name)
		if e.Name == events.NameSandboxSkipped {
			var p events.SandboxSkipped
			if json.Unmarshal(e.Payload, &p); !p.FileSecretsDropped || p.Refused {
				t.Errorf("sandbox_skipped %s: want file_secrets_dropped and not refused", e.Payload)
			}
		}
	}
	if !slices.Contains(names, events.NameSandboxSkipped) || slices.Contains(names, events.NameSandboxRecycled) ||
		slices.Contains(names, events.NameSandboxBuildStarted) {
		t.Errorf("events: %v", names)
	}

	_, err = m.Admit(t.Context(), sandkeep.RunRequest{Key: key, Mode: "none", Template: "withsecret"})
	if sandkeep.CodeOf(err) != "SECRETS_NEED_SANDBOX" {
		t.Fatalf("none with secret files: %v", err)
	}
	refused, _ := st.ListRuns(t.Context(), store.RunFilter{Status: store.StatusFailed})
	if len(refused) != 1 || refused[0].FailureCode != "SECRETS_NEED_SANDBOX" || refused[0].Admission != store.AdmissionRefused ||
		refused[0].Disposition != store.DispositionDeterministic {
		t.Errorf("refused runs: %+v", refused)
	}
	// none without secret files still runs on the host.
	if _, err := m.Admit(t.Context(), sandkeep.RunRequest{Key: key, Mode: "none"}); err != nil {
		t.Errorf("none without secret files: %v", err)
	}
}
