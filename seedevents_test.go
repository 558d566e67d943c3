package sandkeep_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
	"github.com/sandkeep/sandkeep/internal/engine"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

const fakeImageID = "sha256:5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed"

// fakeConfig is a Config whose one driver is the fake standing in for Docker (it binds no host paths), with a
// store: admission and the events of the engine without an engine.
func fakeConfig(t *testing.T) sandkeep.Config {
	t.Helper()
	drv := fake.New(fake.WithTempDir(t.TempDir()), fake.WithImage("seed-img", fakeImageID))
	cfg := sandkeep.Config{Home: t.TempDir(), Image: "seed-img", AgentPath: testutil.AgentBinary(t), NoSweeper: true,
		Drivers: []sandkeep.DriverOption{engine.DriverOption{Name: sandkeep.DriverDocker,
			New: func(engine.DriverEnv) (engine.Driver, error) { return drv, nil }}}}
	return withStore(t, cfg, filepath.Join(t.TempDir(), "runs.db"))
}

// runEvents admits a run for key with rr's fields, runs script in it and returns its output and its recorded
// events.
func runEvents(t *testing.T, m *sandkeep.Manager, st store.Store, rr sandkeep.RunRequest, script string) (string, []events.Event) {
	t.Helper()
	run, err := m.Admit(t.Context(), rr)
	if err != nil {
		t.Fatalf("admit: %v", err)
	}
	res, err := run.Exec(t.Context(), sandkeep.ExecRequest{Argv: []string{"sh", "-c", script}})
	run.Finish(err)
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	evs, err := st.ListEvents(t.Context(), store.EventFilter{RunID: run.ID})
	if err != nil {
		t.Fatal(err)
	}
	return string(res.Stdout), evs
}

func eventNames(evs []events.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Name)
	}
	return out
}

func decodeOne[T any](t *testing.T, evs []events.Event, name string) T {
	t.Helper()
	var found []T
	for _, e := range evs {
		if e.Name == name {
			var p T
			if err := json.Unmarshal(e.Payload, &p); err != nil {
				t.Fatal(err)
			}
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		t.Fatalf("events %v: want one %s", eventNames(evs), name)
	}
	return found[0]
}

// TestSandboxShared: the run that makes a key's sandbox does not share it; a later run whose first command runs
// in that live sandbox says sandbox_shared (once, before its first exec_started), and so does a run attached by
// id from another Manager (another process).
func TestSandboxShared(t *testing.T) {
	t.Parallel()
	cfg := fakeConfig(t)
	m, err := sandkeep.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	key := sandkeep.Key{Tenant: "acme", User: "shared"}
	_, first := runEvents(t, m, cfg.Store, sandkeep.RunRequest{Key: key}, "true")
	if slices.Contains(eventNames(first), events.NameSandboxShared) {
		t.Errorf("the run that made the sandbox: %v", eventNames(first))
	}

	run, err := m.Admit(t.Context(), sandkeep.RunRequest{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := run.Exec(t.Context(), sandkeep.ExecRequest{Argv: []string{"true"}}); err != nil {
			t.Fatal(err)
		}
	}
	evs, _ := cfg.Store.ListEvents(t.Context(), store.EventFilter{RunID: run.ID})
	names := eventNames(evs)
	sh := decodeOne[events.SandboxShared](t, evs, events.NameSandboxShared)
	if sh.Sandbox != key.ContainerName() || sh.Driver != "docker" || sh.Adopted {
		t.Errorf("sandbox_shared = %+v", sh)
	}
	if slices.Index(names, events.NameSandboxShared) > slices.Index(names, events.NameExecStarted) {
		t.Errorf("events %v: sandbox_shared comes before the first exec_started", names)
	}

	// Another process attaches to the run: its first command shares the sandbox too.
	other, err := sandkeep.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	before := len(evs)
	if _, err := other.ExecWith(t.Context(), sandkeep.RunRequest{Key: key, RunID: run.ID}, sandkeep.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	run.Finish(nil)
	evs, _ = cfg.Store.ListEvents(t.Context(), store.EventFilter{RunID: run.ID})
	if got := eventNames(evs[before:]); !slices.Contains(got, events.NameSandboxShared) {
		t.Errorf("the attached command's events %v lack sandbox_shared", got)
	}
}

// TestHostBindsDropped: on a driver that cannot bind host paths, the operator's host bind is dropped rather than
// the sandbox refused, the variables that pointed into its target are withdrawn (one alone, one in a list), an
// unrelated one that only shares a prefix stays, and sandbox_host_binds_dropped says so.
func TestHostBindsDropped(t *testing.T) {
	t.Parallel()
	cfg := fakeConfig(t)
	cfg.Mounts = []string{"type=bind,source=" + t.TempDir() + ",target=/opt/cache,readonly"}
	cfg.Env = []string{"CACHE_DIR=/opt/cache/go", "TOOLS=/usr/bin:/opt/cache/bin", "NEARBY=/opt/cachet"}
	m, err := sandkeep.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	out, evs := runEvents(t, m, cfg.Store, sandkeep.RunRequest{Key: sandkeep.Key{Tenant: "acme", User: "binds"}},
		`echo "cache=${CACHE_DIR-unset} tools=${TOOLS-unset} nearby=${NEARBY-unset}"`)
	if got := strings.TrimSpace(out); got != "cache=unset tools=unset nearby=/opt/cachet" {
		t.Errorf("the command saw %q", got)
	}
	d := decodeOne[events.HostBindsDropped](t, evs, events.NameHostBindsDropped)
	if d.Driver != "fake" || !slices.Equal(d.Targets, []string{"/opt/cache"}) || !slices.Equal(d.Withdrawn, []string{"CACHE_DIR", "TOOLS"}) {
		t.Errorf("sandbox_host_binds_dropped = %+v", d)
	}
}

// TestDevcontainerUserRemap: devcontainer.json's remoteUser names a user sandkeep does not create or switch to;
// the run says, in sandbox_user_remap, that the sandbox's uid stands for it.
func TestDevcontainerUserRemap(t *testing.T) {
	t.Parallel()
	cfg := fakeConfig(t)
	cfg.User = "1000:1000"
	cfg.Spec = devcontainerRepo(t, `{"image": "seed-img", "remoteUser": "vscode"}`)
	m, err := sandkeep.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	_, evs := runEvents(t, m, cfg.Store, sandkeep.RunRequest{Key: sandkeep.Key{Tenant: "acme", User: "remap"}}, "true")
	r := decodeOne[events.UserRemap](t, evs, events.NameUserRemap)
	if r.Origin != events.RemapDevcontainer || r.Field != "remoteUser" || r.User != "vscode" || r.UID != 1000 || r.GID != 1000 {
		t.Errorf("sandbox_user_remap = %+v", r)
	}
}

// TestHostBindsOnDriver: the operator's host bind on the suite's driver. Docker binds it: the variable that
// points into it stays and nothing is dropped. Kubernetes cannot: the sandbox is made without it (not refused at
// create), the variable is withdrawn and sandbox_host_binds_dropped says so.
func TestHostBindsOnDriver(t *testing.T) {
	t.Parallel()
	cfg := withStore(t, baseConfig(t), filepath.Join(t.TempDir(), "runs.db"))
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "tool"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Mounts = append(cfg.Mounts, "type=bind,source="+src+",target=/opt/hostcache,readonly")
	cfg.Env = append(cfg.Env, "HOSTCACHE=/opt/hostcache/tool")
	s := newSuite(t, cfg)
	key := s.key("acme", "binds")
	out, evs := runEvents(t, s.m, cfg.Store, sandkeep.RunRequest{Key: key}, `echo "${HOSTCACHE-unset}"; cat /opt/hostcache/tool 2>/dev/null || echo absent`)
	dropped := slices.Contains(eventNames(evs), events.NameHostBindsDropped)
	if onKube {
		if got := strings.TrimSpace(out); got != "unset\nabsent" || !dropped {
			t.Fatalf("on kubernetes: %q, events %v; want the bind dropped, its variable withdrawn, and the event", got, eventNames(evs))
		}
		d := decodeOne[events.HostBindsDropped](t, evs, events.NameHostBindsDropped)
		if d.Driver != "kubernetes" || !slices.Equal(d.Targets, []string{"/opt/hostcache"}) || !slices.Equal(d.Withdrawn, []string{"HOSTCACHE"}) {
			t.Errorf("sandbox_host_binds_dropped = %+v", d)
		}
		return
	}
	if got := strings.TrimSpace(out); got != "/opt/hostcache/tool\nfrom the host" || dropped {
		t.Errorf("on docker: %q, events %v; want the bind and its variable", got, eventNames(evs))
	}
}
