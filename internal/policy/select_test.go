package policy

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sandkeep/sandkeep/internal/fault"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHostKind(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    Kind
		wantErr bool
	}{
		{name: "nothing set", want: KindLocal},
		{name: "kubernetes", env: map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, want: KindCloud},
		{name: "forced local in a pod", env: map[string]string{EnvHostKind: "local", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}, want: KindLocal},
		{name: "forced cloud", env: map[string]string{EnvHostKind: "cloud"}, want: KindCloud},
		{name: "invalid", env: map[string]string{EnvHostKind: "Cloud"}, wantErr: true},
		{name: "invalid even in a pod", env: map[string]string{EnvHostKind: "k8s", "KUBERNETES_SERVICE_HOST": "x"}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := HostKind(func(k string) string { return tc.env[k] })
			if tc.wantErr {
				if fault.CodeOf(err) != fault.InvalidArgument {
					t.Fatalf("HostKind = %q, %v; want INVALID_ARGUMENT", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("HostKind = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestPreference(t *testing.T) {
	if got := Preference(KindLocal); !slices.Equal(got, []string{"docker", "podman", "host"}) {
		t.Errorf("local: %v", got)
	}
	if got := Preference(KindCloud); !slices.Equal(got, []string{"kubernetes", "host"}) {
		t.Errorf("cloud: %v", got)
	}
	if got := Preference("mars"); got != nil {
		t.Errorf("unknown kind: %v", got)
	}
}

// probes builds candidates whose probe fails with the given error (nil: usable) and counts calls.
type probes struct {
	calls sync.Map // name -> *atomic.Int32
}

func (p *probes) candidates(errs map[string]error) map[string]Candidate {
	out := map[string]Candidate{}
	for name, err := range errs {
		v, _ := p.calls.LoadOrStore(name, new(atomic.Int32))
		n := v.(*atomic.Int32)
		out[name] = Candidate{Name: name, Probe: func(ctx context.Context) error { n.Add(1); return err }}
	}
	return out
}

func (p *probes) count(name string) int32 {
	v, ok := p.calls.Load(name)
	if !ok {
		return 0
	}
	return v.(*atomic.Int32).Load()
}

var (
	errDown   = errors.New("daemon down")
	errNoSock = errors.New("no podman socket")
	errAgent  = errors.New("agent missing")
)

func TestSelect(t *testing.T) {
	tests := []struct {
		name         string
		kind         Kind
		explicit     string
		probes       map[string]error // absent: no candidate
		want         Selection
		wantNoSb     bool // obstacle is a *NoSandboxError
		wantTried    []string
		wantCode     fault.Code // a hard error's code
		wantCause    error
		wantExplicit bool
	}{
		{name: "docker first", kind: KindLocal, probes: map[string]error{"docker": nil, "podman": nil, "host": nil},
			want: Selection{Driver: "docker", Sandboxing: true}},
		{name: "podman when docker is down", kind: KindLocal, probes: map[string]error{"docker": errDown, "podman": nil, "host": nil},
			want: Selection{Driver: "podman", Sandboxing: true}},
		{name: "podman when docker is not configured", kind: KindLocal, probes: map[string]error{"podman": nil, "host": nil},
			want: Selection{Driver: "podman", Sandboxing: true}},
		{name: "host last, marked", kind: KindLocal, probes: map[string]error{"docker": errDown, "podman": errNoSock, "host": nil},
			want: Selection{Driver: "host"}, wantNoSb: true, wantTried: []string{"docker", "podman"}},
		{name: "nothing at all", kind: KindLocal, probes: map[string]error{"docker": errDown, "host": errAgent},
			want: Selection{}, wantNoSb: true, wantTried: []string{"docker", "podman", "host"}},
		{name: "cloud: kubernetes", kind: KindCloud, probes: map[string]error{"docker": nil, "kubernetes": nil, "host": nil},
			want: Selection{Driver: "kubernetes", Sandboxing: true}},
		{name: "cloud never picks docker", kind: KindCloud, probes: map[string]error{"docker": nil, "kubernetes": errDown, "host": nil},
			want: Selection{Driver: "host"}, wantNoSb: true, wantTried: []string{"kubernetes"}},
		{name: "explicit usable", kind: KindLocal, explicit: "podman", probes: map[string]error{"docker": nil, "podman": nil},
			want: Selection{Driver: "podman", Sandboxing: true}},
		{name: "explicit off-kind usable", kind: KindLocal, explicit: "kubernetes", probes: map[string]error{"kubernetes": nil},
			want: Selection{Driver: "kubernetes", Sandboxing: true}},
		{name: "explicit unavailable is hard", kind: KindLocal, explicit: "docker", probes: map[string]error{"docker": errDown, "host": nil},
			wantCode: fault.SandboxDriverUnavailable, wantCause: errDown},
		{name: "explicit not configured is hard", kind: KindLocal, explicit: "podman", probes: map[string]error{"docker": nil},
			wantCode: fault.SandboxDriverUnavailable, wantCause: errNotConfigured},
		{name: "explicit unknown", kind: KindLocal, explicit: "dockr", probes: map[string]error{"docker": nil},
			wantCode: fault.InvalidArgument},
		{name: "explicit host is marked", kind: KindLocal, explicit: "host", probes: map[string]error{"docker": nil, "host": nil},
			want: Selection{Driver: "host"}, wantNoSb: true, wantExplicit: true},
		{name: "explicit host unavailable", kind: KindLocal, explicit: "host", probes: map[string]error{"host": errAgent},
			wantCode: fault.SandboxDriverUnavailable, wantCause: errAgent},
		{name: "unknown kind", kind: "mars", probes: map[string]error{"docker": nil}, wantCode: fault.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p probes
			s := NewSelector(0)
			got, err := s.Select(t.Context(), tc.kind, tc.explicit, p.candidates(tc.probes))
			var nsb *NoSandboxError
			isNoSb := errors.As(err, &nsb)
			switch {
			case tc.wantCode != "":
				if fault.CodeOf(err) != tc.wantCode || isNoSb {
					t.Fatalf("Select = %+v, %v; want a hard error with code %s", got, err, tc.wantCode)
				}
				if tc.wantCause != nil && !errors.Is(err, tc.wantCause) {
					t.Errorf("error %v does not wrap the probe's reason %v", err, tc.wantCause)
				}
				var fe *fault.Error
				if errors.As(err, &fe) && fe.Hint == "" {
					t.Errorf("error %v has no hint", err)
				}
				return
			case tc.wantNoSb:
				if !isNoSb {
					t.Fatalf("Select = %+v, %v; want a *NoSandboxError obstacle", got, err)
				}
				if nsb.Explicit != tc.wantExplicit {
					t.Errorf("Explicit = %v", nsb.Explicit)
				}
				var tried []string
				for _, f := range nsb.Tried {
					tried = append(tried, f.Driver)
				}
				if !slices.Equal(tried, tc.wantTried) {
					t.Errorf("tried %v, want %v", tried, tc.wantTried)
				}
			case err != nil:
				t.Fatalf("Select: %v", err)
			}
			if got != tc.want {
				t.Errorf("Select = %+v, want %+v", got, tc.want)
			}
			if got.Driver == DriverHost && got.Sandboxing {
				t.Error("host marked as sandboxing")
			}
		})
	}
}

// TestSelectLazy: drivers after the first usable one are not probed.
func TestSelectLazy(t *testing.T) {
	var p probes
	s := NewSelector(0)
	if _, err := s.Select(t.Context(), KindLocal, "", p.candidates(map[string]error{"docker": nil, "podman": nil, "host": nil})); err != nil {
		t.Fatal(err)
	}
	if p.count("podman") != 0 || p.count("host") != 0 {
		t.Errorf("probed podman %d, host %d times after docker answered", p.count("podman"), p.count("host"))
	}
}

// TestSelectCachesOncePerProcess: many Selects, sequential and concurrent, probe each driver once, and a failed
// probe is remembered too.
func TestSelectCachesOncePerProcess(t *testing.T) {
	release := make(chan struct{})
	var dockerCalls, hostCalls atomic.Int32
	cands := map[string]Candidate{
		"docker": {Name: "docker", Probe: func(ctx context.Context) error {
			dockerCalls.Add(1)
			<-release
			return errDown
		}},
		"host": {Name: "host", Probe: func(ctx context.Context) error { hostCalls.Add(1); return nil }},
	}
	s := NewSelector(time.Minute)
	var wg sync.WaitGroup
	results := make([]Selection, 32)
	for i := range results {
		wg.Go(func() {
			results[i], _ = s.Select(context.Background(), KindLocal, "", cands)
		})
	}
	time.Sleep(50 * time.Millisecond) // let them pile up behind the one probe
	close(release)
	wg.Wait()
	for i := 0; i < 5; i++ {
		sel, err := s.Select(t.Context(), KindLocal, "", cands)
		if sel.Driver != DriverHost || !errors.Is(err, errDown) {
			t.Fatalf("Select = %+v, %v", sel, err)
		}
	}
	for i, r := range results {
		if r.Driver != DriverHost {
			t.Errorf("concurrent Select %d = %+v", i, r)
		}
	}
	if dockerCalls.Load() != 1 || hostCalls.Load() != 1 {
		t.Errorf("docker probed %d times, host %d; want once each", dockerCalls.Load(), hostCalls.Load())
	}
}

// TestSelectProbeTimeout: a probe that never answers is cut at the timeout and counts as unavailable.
func TestSelectProbeTimeout(t *testing.T) {
	cands := map[string]Candidate{
		"docker": {Name: "docker", Probe: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }},
		"host":   {Name: "host", Probe: func(ctx context.Context) error { return nil }},
	}
	s := NewSelector(50 * time.Millisecond)
	start := time.Now()
	sel, err := s.Select(t.Context(), KindLocal, "", cands)
	if sel.Driver != DriverHost || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Select = %+v, %v; want host with a deadline obstacle", sel, err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("took %v", el)
	}
}

// TestSelectCallerCancel: a caller whose ctx ends leaves at once with ctx's error, and its leaving is not
// cached as the driver being unavailable; a leader whose ctx ends still completes the probe for the others.
func TestSelectCallerCancel(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	cands := map[string]Candidate{"docker": {Name: "docker", Probe: func(ctx context.Context) error {
		if calls.Add(1) == 1 {
			close(started)
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}}
	s := NewSelector(time.Minute)

	leaderCtx, cancelLeader := context.WithCancel(context.Background())
	leaderDone := make(chan error, 1)
	go func() {
		_, err := s.Select(leaderCtx, KindLocal, "", cands)
		leaderDone <- err
	}()
	<-started

	waiterCtx, cancelWaiter := context.WithCancel(context.Background())
	cancelWaiter()
	if _, err := s.Select(waiterCtx, KindLocal, "", cands); !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter with a cancelled ctx: %v; want context.Canceled", err)
	}
	cancelLeader() // must not cancel the probe itself
	close(release)
	if err := <-leaderDone; !errors.Is(err, context.Canceled) {
		t.Errorf("leader: %v; want its own context.Canceled", err)
	}
	sel, err := s.Select(t.Context(), KindLocal, "", cands)
	if err != nil || sel.Driver != DriverDocker {
		t.Fatalf("after the probe: %+v, %v; want docker", sel, err)
	}
	if calls.Load() != 1 {
		t.Errorf("probed %d times", calls.Load())
	}
}

func TestSharedIsOne(t *testing.T) {
	first, second := Shared(), Shared()
	if first != second {
		t.Error("Shared returned two selectors")
	}
}

// TestSelectRetriesAFailedProbe: a driver that failed its probe is probed again once FailedProbeTTL has passed
// (a server started before its engine finds it), and not before; a success is kept.
func TestSelectRetriesAFailedProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := false
		probes := 0
		cands := map[string]Candidate{DriverDocker: {Name: DriverDocker, Probe: func(context.Context) error {
			probes++
			if !up {
				return errors.New("engine down")
			}
			return nil
		}}}
		s := NewSelector(time.Second)
		if sel, _ := s.Select(t.Context(), KindLocal, "", cands); sel.Sandboxing {
			t.Fatalf("selected %+v with the engine down", sel)
		}
		up = true
		if sel, _ := s.Select(t.Context(), KindLocal, "", cands); sel.Sandboxing || probes != 1 {
			t.Fatalf("re-probed at once: %+v after %d probes", sel, probes)
		}
		time.Sleep(FailedProbeTTL + time.Second)
		if sel, _ := s.Select(t.Context(), KindLocal, "", cands); !sel.Sandboxing || sel.Driver != DriverDocker || probes != 2 {
			t.Fatalf("after the TTL: %+v after %d probes", sel, probes)
		}
		time.Sleep(FailedProbeTTL + time.Second)
		s.Select(t.Context(), KindLocal, "", cands)
		if probes != 2 {
			t.Errorf("a success was probed again: %d probes", probes)
		}
	})
}
