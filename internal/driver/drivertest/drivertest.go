// Package drivertest is the one conformance suite every driver.Driver passes, the real ones (Docker) and the
// fakes the layers above test against alike. A driver's test calls Run with a Harness that says how to make the
// driver and a valid CreateSpec for it; the suite checks the contract in driver.Driver, including the error
// classes (github.com/containerd/errdefs) the lifecycle relies on.
//
// Every subtest is independent and parallel, uses its own installation id, and removes what it made, even on
// failure. Timing assertions are deliberately loose: the suite checks that a deadline is honoured, never how fast
// anything is.
package drivertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Harness is what the suite needs to know about one driver.
type Harness struct {
	// New returns a fresh driver. It is called once per subtest; the driver may be shared by the harness behind
	// the scenes (one Docker daemon), since every subtest uses its own installation id and names.
	New func(t *testing.T) driver.Driver
	// Image is an image ref the driver resolves without network (e.g. the busybox test image). It must have
	// sh, echo, cat, sleep, head and tr.
	Image string
	// MissingImage is a ref that cannot be resolved (for Docker: "localhost:1/sandkeep-missing:none").
	MissingImage string
	// Spec returns a valid CreateSpec for key in this installation: posture (with the agent as init and a
	// workspace at /workspace), name and labels, including Labels[driver.LabelInstallation] = installation.
	// Image and ImageID may be left empty: the suite then fills them with Image and its resolved ID.
	Spec func(t *testing.T, key identity.Key, installation string) *driver.CreateSpec
}

// Generous bounds: the suite checks that deadlines are honoured, not speed.
const (
	opTimeout   = 3 * time.Minute  // one subtest's whole budget
	cleanupWait = 30 * time.Second // cleanup of one sandbox
	stopGrace   = 2 * time.Second
	slowSleep   = 30 * time.Second // what a timed-out or cancelled command would take if it ran to the end
	killBound   = 20 * time.Second // "well before slowSleep"
)

// Run runs the conformance suite against the driver h describes.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil || h.Spec == nil || h.Image == "" || h.MissingImage == "" {
		t.Fatal("drivertest: Harness needs New, Spec, Image and MissingImage")
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, f *fixture)
	}{
		{"Ping", testPing},
		{"ResolveImage", testResolveImage},
		{"ResolveMissingImage", testResolveMissingImage},
		{"InspectAbsent", testInspectAbsent},
		{"Create", testCreate},
		{"CreateConflict", testCreateConflict},
		{"CreateConcurrent", testCreateConcurrent},
		{"ExecNotRunning", testExecNotRunning},
		{"Start", testStart},
		{"ExecStreams", testExecStreams},
		{"ExecExitCodes", testExecExitCodes},
		{"ExecTimeout", testExecTimeout},
		{"ExecCancel", testExecCancel},
		{"ExecTruncation", testExecTruncation},
		{"ExecStatePersists", testExecStatePersists},
		{"StopStart", testStopStart},
		{"Remove", testRemove},
		{"List", testList},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newFixture(t, h))
		})
	}
}

// fixture is one subtest's driver, context and installation.
type fixture struct {
	h            Harness
	d            driver.Driver
	ctx          context.Context
	installation string
	reqID        atomic.Uint32
}

func newFixture(t *testing.T, h Harness) *fixture {
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	t.Cleanup(cancel)
	return &fixture{h: h, d: h.New(t), ctx: ctx, installation: "drivertest-" + randHex(t, 6)}
}

func randHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// spec returns the harness's spec for user in this fixture's installation, with Image and ImageID filled in.
func (f *fixture) spec(t *testing.T, user string) *driver.CreateSpec {
	t.Helper()
	key, err := identity.New(f.installation, user)
	if err != nil {
		t.Fatal(err)
	}
	spec := f.h.Spec(t, key, f.installation)
	if spec.Key.IsZero() {
		spec.Key = key
	}
	if spec.Name == "" {
		spec.Name = key.ContainerName()
	}
	if spec.Image == "" {
		spec.Image = f.h.Image
	}
	if spec.ImageID == "" {
		spec.ImageID = f.resolve(t, spec.Image)
	}
	if got := spec.Labels[driver.LabelInstallation]; got != f.installation {
		t.Fatalf("harness Spec: label %s = %q, want %q", driver.LabelInstallation, got, f.installation)
	}
	return spec
}

func (f *fixture) resolve(t *testing.T, ref string) string {
	t.Helper()
	id, err := f.d.ResolveImage(f.ctx, ref)
	if err != nil {
		t.Fatalf("ResolveImage(%q): %v", ref, err)
	}
	return id
}

// create creates spec and registers its removal, which runs even when the test fails or its ctx is done.
func (f *fixture) create(t *testing.T, spec *driver.CreateSpec) *driver.Sandbox {
	t.Helper()
	f.cleanupName(t, spec.Name)
	sb, err := f.d.Create(f.ctx, spec)
	if err != nil {
		t.Fatalf("Create(%s): %v", spec.Name, err)
	}
	return sb
}

// cleanupName removes whatever sandbox holds name when the test ends.
func (f *fixture) cleanupName(t *testing.T, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(f.ctx), cleanupWait)
		defer cancel()
		sb, err := f.d.Inspect(ctx, name)
		if errdefs.IsNotFound(err) {
			return
		}
		if err != nil {
			t.Errorf("cleanup: Inspect(%s): %v", name, err)
			return
		}
		if err := f.d.Remove(ctx, sb); err != nil {
			t.Errorf("cleanup: Remove(%s): %v", name, err)
		}
	})
}

// running creates and starts a sandbox for user.
func (f *fixture) running(t *testing.T, user string) *driver.Sandbox {
	t.Helper()
	sb := f.create(t, f.spec(t, user))
	if err := f.d.Start(f.ctx, sb); err != nil {
		t.Fatalf("Start(%s): %v", sb.Name, err)
	}
	return sb
}

func (f *fixture) inspect(t *testing.T, name string) *driver.Sandbox {
	t.Helper()
	sb, err := f.d.Inspect(f.ctx, name)
	if err != nil {
		t.Fatalf("Inspect(%s): %v", name, err)
	}
	return sb
}

// request is an exec request with the suite's defaults: workdir /workspace, 60 s timeout, default limits.
func (f *fixture) request(argv ...string) agentproto.Request {
	return agentproto.Request{
		Version:     agentproto.Version,
		ID:          f.reqID.Add(1),
		Argv:        argv,
		Workdir:     driver.WorkspaceDir,
		TimeoutMS:   60_000,
		GraceMS:     500,
		StdoutLimit: agentproto.DefaultLimit,
		StderrLimit: agentproto.DefaultLimit,
	}
}

// execResult is one exec's report and its captured streams.
type execResult struct {
	agentproto.Result
	stdout, stderr string
	elapsed        time.Duration
}

// exec runs req in sb with ctx. Plain buffers on purpose: a driver that writes after Exec returned is a race
// the race detector reports.
func (f *fixture) exec(ctx context.Context, sb *driver.Sandbox, req agentproto.Request) (execResult, error) {
	var stdout, stderr bytes.Buffer
	start := time.Now()
	res, err := f.d.Exec(ctx, sb, req, driver.Output{Stdout: &stdout, Stderr: &stderr})
	return execResult{Result: res, stdout: stdout.String(), stderr: stderr.String(), elapsed: time.Since(start)}, err
}

// mustExec runs req and fails the test on an error.
func (f *fixture) mustExec(t *testing.T, sb *driver.Sandbox, req agentproto.Request) execResult {
	t.Helper()
	r, err := f.exec(f.ctx, sb, req)
	if err != nil {
		t.Fatalf("Exec(%q): %v", req.Argv, err)
	}
	return r
}

func sh(script string) []string { return []string{"sh", "-c", script} }

func testPing(t *testing.T, f *fixture) {
	if err := f.d.Ping(f.ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

func testResolveImage(t *testing.T, f *fixture) {
	first := f.resolve(t, f.h.Image)
	if first == "" {
		t.Fatalf("ResolveImage(%q) returned an empty ID", f.h.Image)
	}
	if again := f.resolve(t, f.h.Image); again != first {
		t.Fatalf("ResolveImage(%q) is not stable: %q then %q", f.h.Image, first, again)
	}
}

func testResolveMissingImage(t *testing.T, f *fixture) {
	id, err := f.d.ResolveImage(f.ctx, f.h.MissingImage)
	if got := fault.CodeOf(err); got != fault.ImageUnavailable {
		t.Fatalf("ResolveImage(%q) = %q, %v; want code %s", f.h.MissingImage, id, err, fault.ImageUnavailable)
	}
}

func testInspectAbsent(t *testing.T, f *fixture) {
	name := identity.ContainerPrefix + "absent-" + randHex(t, 8)
	sb, err := f.d.Inspect(f.ctx, name)
	if !errdefs.IsNotFound(err) {
		t.Fatalf("Inspect(absent) = %+v, %v; want errdefs.ErrNotFound", sb, err)
	}
}

func testCreate(t *testing.T, f *fixture) {
	spec := f.spec(t, "create")
	created := f.create(t, spec)
	if created.ID == "" || created.Name != spec.Name {
		t.Fatalf("Create returned ID %q name %q; want an ID and name %q", created.ID, created.Name, spec.Name)
	}
	sb := f.inspect(t, spec.Name)
	if sb.State != driver.StateStopped {
		t.Errorf("State after Create = %q, want %q", sb.State, driver.StateStopped)
	}
	if sb.ID != created.ID {
		t.Errorf("Inspect ID = %q, Create returned %q", sb.ID, created.ID)
	}
	if sb.ImageID != spec.ImageID {
		t.Errorf("ImageID = %q, want %q", sb.ImageID, spec.ImageID)
	}
	checkLabels(t, sb, spec.Labels)
}

// checkLabels checks that every label given is present; a driver may add more (Docker adds the image's).
func checkLabels(t *testing.T, sb *driver.Sandbox, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got, ok := sb.Labels[k]; !ok || got != v {
			t.Errorf("label %s = %q (present %v), want %q", k, got, ok, v)
		}
	}
}

func testCreateConflict(t *testing.T, f *fixture) {
	spec := f.spec(t, "conflict")
	first := f.create(t, spec)

	second := *spec
	second.Labels = maps.Clone(spec.Labels)
	second.Labels[driver.LabelPosture] = "different-" + randHex(t, 4)
	sb, err := f.d.Create(f.ctx, &second)
	if !errdefs.IsConflict(err) {
		t.Fatalf("second Create(%s) = %+v, %v; want errdefs.ErrConflict", spec.Name, sb, err)
	}
	got := f.inspect(t, spec.Name)
	if got.ID != first.ID {
		t.Errorf("after the conflict the sandbox ID is %q, want the first one %q", got.ID, first.ID)
	}
	if got.State != driver.StateStopped {
		t.Errorf("after the conflict the state is %q, want %q", got.State, driver.StateStopped)
	}
	checkLabels(t, got, spec.Labels)
}

func testCreateConcurrent(t *testing.T, f *fixture) {
	const n = 8
	spec := f.spec(t, "concurrent")
	f.cleanupName(t, spec.Name)

	var (
		wg     sync.WaitGroup
		ready  = make(chan struct{})
		errs   = make([]error, n)
		others []error
		ok     int
	)
	for i := range n {
		wg.Go(func() {
			<-ready // line them up so the creates really race
			_, errs[i] = f.d.Create(f.ctx, spec)
		})
	}
	close(ready)
	wg.Wait()
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errdefs.IsConflict(err):
			others = append(others, err)
		}
	}
	if ok != 1 || len(others) > 0 {
		t.Fatalf("%d concurrent Creates of one name: %d succeeded (want 1); non-conflict errors: %v", n, ok, others)
	}
}

func testExecNotRunning(t *testing.T, f *fixture) {
	sb := f.create(t, f.spec(t, "notrunning"))
	r, err := f.exec(f.ctx, sb, f.request("true"))
	if !errdefs.IsConflict(err) {
		t.Fatalf("Exec in a created, unstarted sandbox = %+v, %v; want errdefs.ErrConflict", r.Result, err)
	}
}

func testStart(t *testing.T, f *fixture) {
	before := time.Now().Add(-time.Minute) // engine clocks may lag a little; only "set and recent" matters
	sb := f.running(t, "start")
	got := f.inspect(t, sb.Name)
	if got.State != driver.StateRunning {
		t.Errorf("State after Start = %q, want %q", got.State, driver.StateRunning)
	}
	if got.StartedAt.IsZero() || got.StartedAt.Before(before) {
		t.Errorf("StartedAt after Start = %v, want a time after %v", got.StartedAt, before)
	}
}

func testExecStreams(t *testing.T, f *fixture) {
	sb := f.running(t, "streams")
	r := f.mustExec(t, sb, f.request(sh("echo out; echo err >&2; exit 3")...))
	if r.ExitCode != 3 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Fatalf("exit %d stdout %q stderr %q; want exit 3, %q, %q", r.ExitCode, r.stdout, r.stderr, "out\n", "err\n")
	}
	if r.TimedOut || r.StdoutTruncated || r.StderrTruncated || r.Signal != 0 {
		t.Errorf("flags %+v; want no timeout, truncation or signal", r.Result)
	}
}

func testExecExitCodes(t *testing.T, f *fixture) {
	sb := f.running(t, "exitcodes")
	for _, code := range []int{0, 1, 255} {
		r := f.mustExec(t, sb, f.request(sh(fmt.Sprintf("exit %d", code))...))
		if r.ExitCode != code {
			t.Errorf("exit %d reported as %d", code, r.ExitCode)
		}
	}
}

func testExecTimeout(t *testing.T, f *fixture) {
	sb := f.running(t, "timeout")
	req := f.request("sleep", fmt.Sprint(int(slowSleep/time.Second)))
	req.TimeoutMS = 1000
	r := f.mustExec(t, sb, req)
	if !r.TimedOut {
		t.Errorf("TimedOut = false after a 1 s timeout on sleep; result %+v", r.Result)
	}
	if r.ExitCode == 0 || (r.Signal != 0 && r.ExitCode != 128+r.Signal) {
		t.Errorf("exit %d signal %d; want non-zero, 128+signal when killed", r.ExitCode, r.Signal)
	}
	if r.elapsed > killBound {
		t.Errorf("a 1 s timeout took %v to return", r.elapsed)
	}
}

func testExecCancel(t *testing.T, f *fixture) {
	sb := f.running(t, "cancel")
	ctx, cancel := context.WithCancel(f.ctx)
	time.AfterFunc(500*time.Millisecond, cancel)
	defer cancel()
	r, err := f.exec(ctx, sb, f.request("sleep", fmt.Sprint(int(slowSleep/time.Second))))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Exec after ctx cancel = %+v, %v; want an error wrapping context.Canceled", r.Result, err)
	}
	if r.elapsed > killBound {
		t.Errorf("a cancelled Exec took %v to return", r.elapsed)
	}
	// The sandbox outlives a cancelled command.
	if r := f.mustExec(t, sb, f.request("true")); r.ExitCode != 0 {
		t.Errorf("exec after a cancelled one: exit %d", r.ExitCode)
	}
}

func testExecTruncation(t *testing.T, f *fixture) {
	const limit, produced = 1000, 5000
	sb := f.running(t, "truncation")
	script := fmt.Sprintf("head -c %d /dev/zero | tr '\\0' a; head -c %d /dev/zero | tr '\\0' b >&2", produced, produced)
	req := f.request(sh(script)...)
	req.StdoutLimit, req.StderrLimit = limit, limit
	r := f.mustExec(t, sb, req)
	if r.ExitCode != 0 {
		t.Fatalf("exit %d, stderr %q", r.ExitCode, r.stderr)
	}
	if !r.StdoutTruncated || r.stdout != string(bytes.Repeat([]byte("a"), limit)) {
		t.Errorf("stdout: truncated %v, %d bytes; want truncated, exactly %d 'a'", r.StdoutTruncated, len(r.stdout), limit)
	}
	if !r.StderrTruncated || r.stderr != string(bytes.Repeat([]byte("b"), limit)) {
		t.Errorf("stderr: truncated %v, %d bytes; want truncated, exactly %d 'b'", r.StderrTruncated, len(r.stderr), limit)
	}
}

func testExecStatePersists(t *testing.T, f *fixture) {
	sb := f.running(t, "state")
	writeState(t, f, sb)
	checkState(t, f, sb)
}

// writeState and checkState leave and find a file in the workspace (relative paths: the workdir is /workspace).
func writeState(t *testing.T, f *fixture, sb *driver.Sandbox) {
	t.Helper()
	if r := f.mustExec(t, sb, f.request(sh("echo kept > state.txt")...)); r.ExitCode != 0 {
		t.Fatalf("write state: exit %d, stderr %q", r.ExitCode, r.stderr)
	}
}

func checkState(t *testing.T, f *fixture, sb *driver.Sandbox) {
	t.Helper()
	if r := f.mustExec(t, sb, f.request("cat", "state.txt")); r.ExitCode != 0 || r.stdout != "kept\n" {
		t.Fatalf("read state: exit %d stdout %q stderr %q; want 0, %q", r.ExitCode, r.stdout, r.stderr, "kept\n")
	}
}

func testStopStart(t *testing.T, f *fixture) {
	sb := f.running(t, "stopstart")
	writeState(t, f, sb)
	if err := f.d.Stop(f.ctx, sb, stopGrace); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	got := f.inspect(t, sb.Name)
	if got.State != driver.StateStopped || got.FinishedAt.IsZero() {
		t.Fatalf("after Stop: state %q FinishedAt %v; want %q and set", got.State, got.FinishedAt, driver.StateStopped)
	}
	if err := f.d.Stop(f.ctx, sb, stopGrace); err != nil {
		t.Fatalf("Stop of a stopped sandbox: %v", err)
	}
	if err := f.d.Start(f.ctx, sb); err != nil {
		t.Fatalf("Start after Stop: %v", err)
	}
	if got := f.inspect(t, sb.Name); got.State != driver.StateRunning {
		t.Fatalf("after restart: state %q, want %q", got.State, driver.StateRunning)
	}
	checkState(t, f, sb)
}

func testRemove(t *testing.T, f *fixture) {
	sb := f.running(t, "remove")
	if err := f.d.Remove(f.ctx, sb); err != nil {
		t.Fatalf("Remove of a running sandbox: %v", err)
	}
	if got, err := f.d.Inspect(f.ctx, sb.Name); !errdefs.IsNotFound(err) {
		t.Fatalf("Inspect after Remove = %+v, %v; want errdefs.ErrNotFound", got, err)
	}
	if err := f.d.Remove(f.ctx, sb); err != nil {
		t.Errorf("Remove of a removed sandbox: %v", err)
	}
	if err := f.d.Stop(f.ctx, sb, stopGrace); err != nil {
		t.Errorf("Stop of a removed sandbox: %v", err)
	}
}

func testList(t *testing.T, f *fixture) {
	want := map[string]bool{}
	for _, user := range []string{"list-a", "list-b"} {
		want[f.create(t, f.spec(t, user)).Name] = true
	}
	// Another installation on the same engine: List must not return its sandbox.
	other := &fixture{h: f.h, d: f.d, ctx: f.ctx, installation: f.installation + "-other"}
	foreign := other.create(t, other.spec(t, "list-a"))

	got, err := f.d.List(f.ctx, f.installation)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	seen := map[string]bool{}
	for _, sb := range got {
		if !want[sb.Name] || seen[sb.Name] {
			t.Errorf("List(%s) returned %s (other installation's is %s)", f.installation, sb.Name, foreign.Name)
		}
		if sb.Labels[driver.LabelInstallation] != f.installation {
			t.Errorf("List returned %s labelled %q", sb.Name, sb.Labels[driver.LabelInstallation])
		}
		seen[sb.Name] = true
	}
	if len(seen) != len(want) {
		t.Errorf("List(%s) returned %d of the %d sandboxes created", f.installation, len(seen), len(want))
	}
}
