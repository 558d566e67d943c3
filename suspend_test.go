package sandkeep_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/events"
)

// namedEvents collects events by name, with their payloads.
type namedEvents struct {
	mu  sync.Mutex
	got []any
	nms []string
}

func (l *namedEvents) add(name string, payload any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nms, l.got = append(l.nms, name), append(l.got, payload)
}

func (l *namedEvents) names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.nms)
}

func (l *namedEvents) payload(name string) (any, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, n := range l.nms {
		if n == name {
			return l.got[i], true
		}
	}
	return nil, false
}

// An idle sandbox of a template with suspend_after costs nothing: the sweeper removes its container (on
// kubernetes its pod and record) with a sandbox_suspended event and keeps its workspace; the key's next command
// resumes it transparently, its files back, with sandbox_resumed saying what the resume added to that command. A
// sandbox of a template without suspend_after, idle as long, is not suspended.
func TestSuspend(t *testing.T) {
	cfg := baseConfig(t)
	bg := &namedEvents{}
	cfg.OnEvent = bg.add
	small := sandkeep.Template{SuspendAfter: 100 * time.Millisecond}
	if onKube {
		small.Requests = sandkeep.Requests{CPUs: 0.01, MemoryBytes: 16 << 20}
	}
	cfg.Templates = map[string]sandkeep.Template{"lazy": small, "keen": {}}
	s := newSuite(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	lazy, keen := s.key("suspend", "lazy"), s.key("suspend", "keen")
	run := func(key sandkeep.Key, tmpl, script string, obs *namedEvents) *sandkeep.ExecResult {
		t.Helper()
		rr := sandkeep.RunRequest{Key: key, Template: tmpl}
		if obs != nil {
			rr.Observer.Event = obs.add
		}
		res := s.execRun(s.m, rr, sandkeep.ExecRequest{Argv: []string{"sh", "-c", script}})
		if res.ExitCode != 0 {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q", script, res.ExitCode, res.Stdout, res.Stderr)
		}
		return res
	}
	run(lazy, "lazy", "echo kept > /workspace/notes.txt", nil)
	run(keen, "keen", "echo here > /workspace/notes.txt", nil)
	time.Sleep(300 * time.Millisecond)

	rep, err := s.m.SweepOnce(ctx)
	if err != nil {
		t.Fatalf("SweepOnce: %v", err)
	}
	if !slices.Equal(rep.Suspended, []string{lazy.ContainerName()}) {
		t.Fatalf("suspended %v, want only %s (keen's template has no suspend_after)", rep.Suspended, lazy.ContainerName())
	}
	if s.exists(lazy.ContainerName()) {
		t.Fatal("the suspended sandbox still exists")
	}
	if onKube {
		_, err := s.kc.API.CoreV1().Pods(s.ns).Get(ctx, lazy.ContainerName(), metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			t.Fatalf("the suspended sandbox's pod: %v, want it gone", err)
		}
		if _, err := s.kc.API.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, lazy.ContainerName()+"-workspace", metav1.GetOptions{}); err != nil {
			t.Fatalf("the suspended sandbox's workspace claim: %v, want it kept", err)
		}
	}
	if !s.running(keen.ContainerName()) {
		t.Fatal("keen's sandbox is not running: only lazy's template suspends")
	}
	p, ok := bg.payload(events.NameSandboxSuspended)
	if sus, _ := p.(events.SandboxSuspended); !ok || sus.Sandbox != lazy.ContainerName() || sus.Template != "lazy" || sus.IdleMS < 100 {
		t.Fatalf("sandbox_suspended: %+v (events %v), want lazy's, idle at least 100 ms", p, bg.names())
	}

	// The next command resumes it: the same workspace, a new sandbox, and the resume's cost reported.
	obs := &namedEvents{}
	res := run(lazy, "lazy", "cat /workspace/notes.txt", obs)
	if res.Stdout != "kept\n" {
		t.Fatalf("after the resume the workspace holds %q, want %q", res.Stdout, "kept\n")
	}
	p, ok = obs.payload(events.NameSandboxResumed)
	resumed, _ := p.(events.SandboxResumed)
	if !ok || resumed.Sandbox != lazy.ContainerName() || resumed.Driver != s.driverName() || resumed.DurationMS <= 0 || resumed.SuspendedMS <= 0 {
		t.Fatalf("sandbox_resumed: %+v (events %v), want lazy's with its duration", p, obs.names())
	}
	t.Logf("resumed in %d ms after %d ms suspended", resumed.DurationMS, resumed.SuspendedMS)
	if !s.exists(lazy.ContainerName()) {
		t.Fatal("no sandbox after the resume")
	}
	// Only the first command after a suspend is a resume.
	obs = &namedEvents{}
	run(lazy, "lazy", "true", obs)
	if _, ok := obs.payload(events.NameSandboxResumed); ok {
		t.Fatalf("a second sandbox_resumed: %v", obs.names())
	}
}

// TestPauseOnRetention: a template may pause its sandboxes rather than have them removed when their time runs
// out. Past Retention (and with RemoveWorkspaceOnRetention on) the sweeper removes a plain template's sandbox
// with its workspace, but suspends the pausing template's (sandbox_suspended, reason retention) and keeps its
// workspace; that key's next command resumes it (sandbox_resumed) with its files.
func TestPauseOnRetention(t *testing.T) {
	cfg := baseConfig(t)
	bg := &namedEvents{}
	cfg.OnEvent = bg.add
	cfg.IdleTimeout, cfg.Retention, cfg.RemoveWorkspaceOnRetention = 100*time.Millisecond, 100*time.Millisecond, true
	pausing := sandkeep.Template{PauseOnRetention: true}
	if onKube {
		pausing.Requests = sandkeep.Requests{CPUs: 0.01, MemoryBytes: 16 << 20}
	}
	cfg.Templates = map[string]sandkeep.Template{"pausing": pausing, "plain": {Requests: pausing.Requests}}
	s := newSuite(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	p, q := s.key("pause", "p"), s.key("pause", "q")
	run := func(key sandkeep.Key, tmpl, script string, obs *namedEvents) string {
		t.Helper()
		rr := sandkeep.RunRequest{Key: key, Template: tmpl}
		if obs != nil {
			rr.Observer.Event = obs.add
		}
		res := s.execRun(s.m, rr, sandkeep.ExecRequest{Argv: []string{"sh", "-c", script}})
		if res.ExitCode != 0 {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q", script, res.ExitCode, res.Stdout, res.Stderr)
		}
		return res.Stdout
	}
	run(p, "pausing", "echo kept > /workspace/notes.txt", nil)
	run(q, "plain", "echo gone > /workspace/notes.txt", nil)
	sweep := func() sandkeep.SweepReport {
		t.Helper()
		time.Sleep(300 * time.Millisecond)
		rep, err := s.m.SweepOnce(ctx)
		if err != nil {
			t.Fatalf("SweepOnce: %v", err)
		}
		return rep
	}
	if rep := sweep(); len(rep.Stopped) != 2 || len(rep.Suspended)+len(rep.Removed) != 0 {
		t.Fatalf("the first sweep (idle): %+v, want both stopped", rep)
	}
	rep := sweep()
	if !slices.Equal(rep.Suspended, []string{p.ContainerName()}) || !slices.Equal(rep.Removed, []string{q.ContainerName()}) {
		t.Fatalf("the sweep past retention: %+v, want %s paused and %s removed", rep, p.ContainerName(), q.ContainerName())
	}
	pl, ok := bg.payload(events.NameSandboxSuspended)
	if sus, _ := pl.(events.SandboxSuspended); !ok || sus.Sandbox != p.ContainerName() || sus.Reason != events.SuspendRetention || sus.Template != "pausing" {
		t.Fatalf("sandbox_suspended: %+v (events %v), want p's with reason retention", pl, bg.names())
	}
	if s.exists(p.ContainerName()) {
		t.Fatal("the paused sandbox still exists")
	}
	obs := &namedEvents{}
	if got := run(p, "pausing", "cat /workspace/notes.txt", obs); got != "kept\n" {
		t.Fatalf("after the resume the workspace holds %q, want kept", got)
	}
	if pl, ok := obs.payload(events.NameSandboxResumed); !ok || pl.(events.SandboxResumed).Sandbox != p.ContainerName() {
		t.Fatalf("sandbox_resumed: %+v (events %v)", pl, obs.names())
	}
	if got := run(q, "plain", "ls /workspace", nil); got != "" {
		t.Fatalf("the removed key's workspace was kept: %q", got)
	}
}
