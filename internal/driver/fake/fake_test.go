package fake_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"go.uber.org/goleak"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/drivertest"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	testImage   = "sandkeep-test:fake"
	testImageID = "sha256:0000000000000000000000000000000000000000000000000000000000000001"
)

func newDriver(t *testing.T) *fake.Driver {
	return fake.New(fake.WithTempDir(t.TempDir()), fake.WithImage(testImage, testImageID))
}

// spec is a CreateSpec shaped like the lifecycle's: driver-default posture, a mounted workspace, full labels.
func spec(t *testing.T, key identity.Key, installation string) *driver.CreateSpec {
	p := driver.Posture{
		User:            "1000:1000",
		ReadOnlyRoot:    true,
		CapDrop:         []string{"ALL"},
		NoNewPrivileges: true,
		PidsLimit:       256,
		MemoryBytes:     512 << 20,
		MemorySwapBytes: 512 << 20,
		NanoCPUs:        1e9,
		Tmpfs:           map[string]string{"/tmp": "rw,nosuid,nodev,size=64m"},
		Network:         "none",
		Mounts:          []driver.Mount{{Source: t.TempDir(), Target: driver.WorkspaceDir}},
		Init:            []string{driver.AgentPath, "init"},
	}
	return &driver.CreateSpec{
		Key: key, Name: key.ContainerName(), Image: testImage, ImageID: testImageID, Posture: p,
		Labels: map[string]string{
			driver.LabelTenant:       key.Tenant,
			driver.LabelUser:         key.User,
			driver.LabelKey:          key.Hex(),
			driver.LabelImage:        testImage,
			driver.LabelImageID:      testImageID,
			driver.LabelPosture:      p.Hash(),
			driver.LabelInstallation: installation,
			driver.LabelCreatedAt:    time.Now().UTC().Format(time.RFC3339),
		},
	}
}

func TestConformance(t *testing.T) {
	drivertest.Run(t, drivertest.Harness{
		New:          func(t *testing.T) driver.Driver { return newDriver(t) },
		Image:        testImage,
		MissingImage: "sandkeep-test:missing",
		Spec:         spec,
	})
}

// running returns a driver and a started sandbox in it. A private workspace (no mount) unless mounted is set.
func running(t *testing.T) (*fake.Driver, *driver.Sandbox) {
	t.Helper()
	d := newDriver(t)
	key, err := identity.New("t", t.Name())
	if err != nil {
		t.Fatal(err)
	}
	s := spec(t, key, "fake-test")
	s.Posture.Mounts = nil
	sb, err := d.Create(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Remove(context.WithoutCancel(t.Context()), sb) })
	if err := d.Start(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	return d, sb
}

func request(argv ...string) agentproto.Request {
	return agentproto.Request{
		Version: agentproto.Version, ID: 1, Argv: argv, Workdir: driver.WorkspaceDir,
		TimeoutMS: 30_000, GraceMS: 500, StdoutLimit: agentproto.DefaultLimit, StderrLimit: agentproto.DefaultLimit,
	}
}

func TestFaults(t *testing.T) {
	d := newDriver(t)
	boom := errors.New("boom")
	d.FailNext(fake.OpPing, boom)
	if err := d.Ping(t.Context()); !errors.Is(err, boom) {
		t.Fatalf("first Ping after FailNext = %v, want boom", err)
	}
	if err := d.Ping(t.Context()); err != nil {
		t.Fatalf("second Ping after FailNext = %v, want nil", err)
	}
	d.SetFault("inspect", errdefs.ErrUnavailable)
	for range 2 {
		if _, err := d.Inspect(t.Context(), "x"); !errdefs.IsUnavailable(err) {
			t.Fatalf("Inspect with a fault set = %v, want unavailable", err)
		}
	}
	d.SetFault("inspect", nil)
	if _, err := d.Inspect(t.Context(), "x"); !errdefs.IsNotFound(err) {
		t.Fatalf("Inspect after clearing = %v, want not found", err)
	}
	if got := d.Calls(fake.OpPing); got != 2 {
		t.Errorf("Calls(ping) = %d, want 2", got)
	}
	if got := d.Calls(fake.OpInspect); got != 3 {
		t.Errorf("Calls(inspect) = %d, want 3", got)
	}
}

func TestRetag(t *testing.T) {
	d := newDriver(t)
	d.Retag(testImage, "sha256:new")
	id, err := d.ResolveImage(t.Context(), testImage)
	if err != nil || id != "sha256:new" {
		t.Fatalf("after Retag: %q, %v", id, err)
	}
	d.RemoveImage(testImage)
	if _, err := d.ResolveImage(t.Context(), testImage); !fault.Is(err, fault.ImageUnavailable) {
		t.Fatalf("after RemoveImage: %v, want IMAGE_UNAVAILABLE", err)
	}
}

// TestLostCreateRace is the 409-adoption setup: another process creates the sandbox between Inspect and Create.
func TestLostCreateRace(t *testing.T) {
	d := newDriver(t)
	key, _ := identity.New("t", "race")
	s := spec(t, key, "fake-test")
	d.SetHooks(fake.Hooks{BeforeCreate: func(spec *driver.CreateSpec) {
		if _, err := d.ExternalCreate(spec); err != nil {
			t.Errorf("ExternalCreate: %v", err)
		}
	}})
	if _, err := d.Create(t.Context(), s); !errdefs.IsConflict(err) {
		t.Fatalf("Create after an external create = %v, want conflict", err)
	}
	sb, err := d.Inspect(t.Context(), s.Name)
	if err != nil || sb.Labels[driver.LabelPosture] != s.Labels[driver.LabelPosture] {
		t.Fatalf("Inspect after the race = %+v, %v", sb, err)
	}
	d.ExternalRemove(s.Name)
	if _, err := d.Inspect(t.Context(), s.Name); !errdefs.IsNotFound(err) {
		t.Fatalf("Inspect after ExternalRemove = %v, want not found", err)
	}
}

func TestForeign(t *testing.T) {
	d := newDriver(t)
	if _, err := d.ExternalCreate(&driver.CreateSpec{Name: "sandkeep-u-foreign", ImageID: testImageID}); err != nil {
		t.Fatal(err)
	}
	sb, err := d.Inspect(t.Context(), "sandkeep-u-foreign")
	if err != nil || len(sb.Labels) != 0 {
		t.Fatalf("foreign: %+v, %v", sb, err)
	}
}

func TestStopKillsRunningExec(t *testing.T) {
	d, sb := running(t)
	started := make(chan struct{})
	d.SetHooks(fake.Hooks{BeforeExec: func(*driver.Sandbox, agentproto.Request) { close(started) }})
	errc := make(chan error, 1)
	go func() {
		_, err := d.Exec(t.Context(), sb, request("sleep", "30"), driver.Output{})
		errc <- err
	}()
	<-started
	time.Sleep(100 * time.Millisecond) // let sleep start; Stop before the start is covered by pending signals
	if err := d.Stop(t.Context(), sb, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, agentproto.ErrProtocol) {
		t.Fatalf("Exec cut by Stop = %v, want ErrProtocol", err)
	}
}

func TestExecStopInHookIsNotRunning(t *testing.T) {
	d, sb := running(t)
	d.SetHooks(fake.Hooks{BeforeExec: func(sb *driver.Sandbox, _ agentproto.Request) {
		if err := d.SetState(sb.Name, driver.StateDead); err != nil {
			t.Error(err)
		}
	}})
	if _, err := d.Exec(t.Context(), sb, request("true"), driver.Output{}); !errdefs.IsConflict(err) {
		t.Fatalf("Exec in a dead sandbox = %v, want conflict", err)
	}
}

func TestExecBackgroundChildDoesNotHold(t *testing.T) {
	d, sb := running(t)
	start := time.Now()
	var out bytes.Buffer
	res, err := d.Exec(t.Context(), sb, request("sh", "-c", "sleep 30 & echo started"), driver.Output{Stdout: &out})
	if err != nil || res.ExitCode != 0 || out.String() != "started\n" {
		t.Fatalf("res %+v out %q err %v", res, out.String(), err)
	}
	if e := time.Since(start); e > 10*time.Second {
		t.Fatalf("a background child held Exec for %v", e)
	}
}

func TestExecDetails(t *testing.T) {
	d, sb := running(t)
	tests := []struct {
		name     string
		req      agentproto.Request
		stdin    string
		wantCode int
		wantOut  string
		wantErr  func(error) bool
	}{
		{name: "stdin", req: withStdin(request("cat")), stdin: "hello", wantOut: "hello"},
		{name: "subdir", req: withWorkdir(request("pwd"), "/workspace/a/b"), wantOut: "/a/b\n"},
		{name: "env", req: withEnv(request("sh", "-c", "echo $FOO"), "FOO=bar"), wantOut: "bar\n"},
		{name: "not found", req: request("/nonexistent/cmd"), wantCode: 127},
		{name: "workdir outside", req: withWorkdir(request("true"), "/etc"), wantErr: errdefs.IsInvalidArgument},
		{name: "workdir escape", req: withWorkdir(request("true"), "/workspace/../etc"), wantErr: errdefs.IsInvalidArgument},
		{name: "empty argv", req: request(), wantErr: errdefs.IsInvalidArgument},
		{name: "killed by signal", req: request("sh", "-c", "kill -9 $$"), wantCode: 137},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			o := driver.Output{Stdout: &out, Stdin: strings.NewReader(tc.stdin)}
			res, err := d.Exec(t.Context(), sb, tc.req, o)
			if tc.wantErr != nil {
				if !tc.wantErr(err) {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tc.wantCode {
				t.Errorf("exit %d (%q), want %d", res.ExitCode, res.StartError, tc.wantCode)
			}
			if tc.wantOut != "" && !strings.HasSuffix(out.String(), tc.wantOut) {
				t.Errorf("stdout %q, want suffix %q", out.String(), tc.wantOut)
			}
		})
	}
}

func withStdin(r agentproto.Request) agentproto.Request { r.Stdin = true; return r }
func withWorkdir(r agentproto.Request, w string) agentproto.Request {
	r.Workdir = w
	return r
}
func withEnv(r agentproto.Request, env ...string) agentproto.Request { r.Env = env; return r }

// TestHookSeesOverlap: the fake does not serialize Execs on one sandbox (the lifecycle's gate must), and
// BeforeExec lets a test see two in flight at once.
func TestHookSeesOverlap(t *testing.T) {
	d, sb := running(t)
	var arrived atomic.Int32
	both := make(chan struct{})
	d.SetHooks(fake.Hooks{BeforeExec: func(*driver.Sandbox, agentproto.Request) {
		if arrived.Add(1) == 2 {
			close(both)
		}
		select { // the first Exec waits in its hook for the second: they overlap
		case <-both:
		case <-time.After(10 * time.Second):
			t.Error("the second Exec never overlapped the first")
		}
	}})
	errc := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := d.Exec(t.Context(), sb, request("true"), driver.Output{})
			errc <- err
		}()
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
}
