package compose

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// postgresTemplate is the shape of the devcontainers "postgres" template's compose file (app + db), with a few
// settings that weaken the posture added.
const postgresTemplate = `
services:
  app:
    build:
      context: ..
      dockerfile: .devcontainer/Dockerfile
      args: {VARIANT: "3.12"}
    volumes:
      - ../..:/workspaces:cached
    command: sleep infinity
    network_mode: service:db
    environment:
      POSTGRES_HOST: localhost
    user: vscode
  db:
    image: postgres:${PG_VERSION:-16}
    restart: unless-stopped
    volumes:
      - postgres-data:/var/lib/postgresql/data
      - /var/run/docker.sock:/var/run/docker.sock
    environment:
      POSTGRES_PASSWORD: postgres
    privileged: true
    cap_add: [SYS_ADMIN]
    ports: ["5432:5432"]
    healthcheck:
      test: ["CMD-SHELL", "pg_isready -U postgres"]
      interval: 2s
      retries: 5
  cache:
    image: redis:7
    depends_on: [db]
volumes:
  postgres-data:
`

func repo(t *testing.T, files map[string]string) *os.Root {
	t.Helper()
	dir := t.TempDir()
	for p, body := range files {
		full := filepath.Join(dir, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestLoadTemplate(t *testing.T) {
	t.Setenv("PG_VERSION", "9") // the host's environment is never read
	r := repo(t, map[string]string{".devcontainer/docker-compose.yml": postgresTemplate})
	p, err := Load(context.Background(), r, []string{".devcontainer/docker-compose.yml"}, "app", nil)
	if err != nil {
		t.Fatal(err)
	}
	sb := p.Sandbox
	if sb.Build == nil || sb.Build.Context != "." || sb.Build.Dockerfile != ".devcontainer/Dockerfile" || sb.Build.Args["VARIANT"] != "3.12" {
		t.Errorf("sandbox build = %+v", sb.Build)
	}
	if sb.User != "vscode" || sb.Env["POSTGRES_HOST"] != "localhost" || !slices.Equal(sb.Command, []string{"sleep", "infinity"}) {
		t.Errorf("sandbox = %+v", sb)
	}
	if len(p.Companions) != 2 || p.Companions[0].Name != "cache" || p.Companions[1].Name != "db" {
		t.Fatalf("companions = %+v", p.Companions)
	}
	db := p.Companions[1]
	if db.Image != "postgres:16" {
		t.Errorf("db image %q: want the default, never the host's PG_VERSION", db.Image)
	}
	if len(db.Volumes) != 1 || db.Volumes[0].Name != "postgres-data" || db.Volumes[0].Target != "/var/lib/postgresql/data" {
		t.Errorf("db volumes = %+v", db.Volumes)
	}
	if db.Healthcheck == nil || db.Healthcheck.Retries != 5 || db.Healthcheck.Test[0] != "CMD-SHELL" {
		t.Errorf("db healthcheck = %+v", db.Healthcheck)
	}
	if !slices.Equal(p.Companions[0].DependsOn, []string{"db"}) {
		t.Errorf("cache depends_on = %v", p.Companions[0].DependsOn)
	}
	var got []string
	for _, d := range p.Dropped {
		if d.Why == "" {
			t.Errorf("drop without a reason: %+v", d)
		}
		got = append(got, d.Service+"."+d.Field)
	}
	for _, want := range []string{"app.network_mode", "app.volumes[0]", "db.privileged", "db.cap_add", "db.ports", "db.volumes[1]", "db.restart"} {
		if !slices.Contains(got, want) {
			t.Errorf("dropped %v lacks %s", got, want)
		}
	}

	p, err = Load(context.Background(), r, []string{".devcontainer/docker-compose.yml"}, "app", []string{"db"})
	if err != nil || len(p.Companions) != 1 || p.Companions[0].Name != "db" {
		t.Errorf("runServices [db]: %+v, %v", p, err)
	}
}

func TestLoadRefuses(t *testing.T) {
	r := repo(t, map[string]string{
		"c.yml":       "services:\n  app: {image: a}\n",
		"escape.yml":  "services:\n  app:\n    build: {context: ../..}\n",
		"noimage.yml": "services:\n  app: {command: x}\n",
		"bad.yml":     "services: [\n",
	})
	for name, tt := range map[string]struct {
		files   []string
		service string
		run     []string
	}{
		"missing service": {[]string{"c.yml"}, "web", nil},
		"missing run":     {[]string{"c.yml"}, "app", []string{"db"}},
		"escape":          {[]string{"escape.yml"}, "app", nil},
		"no image":        {[]string{"noimage.yml"}, "app", nil},
		"syntax":          {[]string{"bad.yml"}, "app", nil},
		"no file":         {[]string{"absent.yml"}, "app", nil},
		"none":            {nil, "app", nil},
	} {
		if _, err := Load(context.Background(), r, tt.files, tt.service, tt.run); fault.CodeOf(err) != fault.ComposeInvalid {
			t.Errorf("%s: err = %v, want COMPOSE_INVALID", name, err)
		}
	}
}

// FuzzLoad: any compose file gives a Project or COMPOSE_INVALID, never a panic; a build stays in the repository.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(postgresTemplate))
	f.Add([]byte("services:\n  app: {image: a, volumes: [\"v:/d\"]}\n  b: {build: ., depends_on: [app]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "c.yml"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := os.OpenRoot(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		p, err := Load(context.Background(), r, []string{"c.yml"}, "app", nil)
		if err != nil {
			if fault.CodeOf(err) != fault.ComposeInvalid {
				t.Fatalf("err %v is not COMPOSE_INVALID", err)
			}
			return
		}
		for _, s := range append([]Service{p.Sandbox}, p.Companions...) {
			if b := s.Build; b != nil && (!filepath.IsLocal(b.Context) && b.Context != "." || !filepath.IsLocal(b.Dockerfile)) {
				t.Fatalf("build leaves the repository: %+v", b)
			}
		}
	})
}
