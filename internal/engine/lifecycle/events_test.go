package lifecycle

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/events"
)

// recorder collects events; safe for the sweeper's and the commands' goroutines.
type recorder struct {
	mu  sync.Mutex
	got []string
	raw []any
}

func (r *recorder) sink(name string, payload any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, name)
	r.raw = append(r.raw, payload)
}

func (r *recorder) take() ([]string, []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g, p := r.got, r.raw
	r.got, r.raw = nil, nil
	return g, p
}

// TestEvents: what the lifecycle decides reaches the caller's sink, in order, with the facts an operator reads
// afterwards; what belongs to no caller (the sweeper) reaches the manager's sink.
func TestEvents(t *testing.T) {
	e := newEnv(t)
	var background recorder
	m := e.manager(func(c *Config) { c.OnEvent = background.sink })
	k := key(t, "acme", "alice")
	var rec recorder
	exec := func(script string) {
		t.Helper()
		req, _ := sh(script)
		req.OnEvent = rec.sink
		if _, err := m.Exec(t.Context(), k, req); err != nil {
			t.Fatal(err)
		}
	}

	exec("echo secret-argument-never-recorded")
	names, payloads := rec.take()
	want := []string{events.NameSandboxStarted, events.NameExecStarted, events.NameExecFinished}
	if !slices.Equal(names, want) {
		t.Fatalf("first command: %v, want %v", names, want)
	}
	if st := payloads[0].(events.SandboxStarted); !st.Created || st.Driver != "fake" {
		t.Errorf("sandbox_started = %+v", st)
	}
	if es := payloads[1].(events.ExecStarted); es.Command != "sh" || es.Transport != string(TransportExec) {
		t.Errorf("exec_started = %+v (argv beyond argv[0] must never be recorded)", es)
	}

	exec("true")
	if names, _ := rec.take(); !slices.Equal(names, []string{events.NameExecStarted, events.NameExecFinished}) {
		t.Fatalf("warm command: %v", names)
	}

	e.drv.Retag(testImage, "sha256:other")
	exec("true")
	names, payloads = rec.take()
	if len(names) < 2 || names[0] != events.NameSandboxRecycled || payloads[0].(events.SandboxRecycled).Reason != events.RecycleImage {
		t.Fatalf("after a retag: %v %+v", names, payloads)
	}

	e.clock.Advance(time.Hour)
	if _, err := m.SweepOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if names, _ := background.take(); !slices.Equal(names, []string{events.NameSandboxStoppedIdle}) {
		t.Fatalf("sweeper events: %v", names)
	}
	if names, _ := rec.take(); len(names) != 0 {
		t.Fatalf("the sweeper's events reached a command's sink: %v", names)
	}
}
