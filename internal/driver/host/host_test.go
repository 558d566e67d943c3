package host_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"go.uber.org/goleak"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/drivertest"
	"github.com/sandkeep/sandkeep/internal/driver/host"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testImage = "sandkeep-test:host"

// spec is a CreateSpec shaped like the lifecycle's, with the workspace in a fresh temporary directory.
func spec(t *testing.T, key identity.Key, installation string) *driver.CreateSpec {
	p := driver.Posture{
		User:    "1000:1000",
		CapDrop: []string{"ALL"},
		Env:     []string{"HOME=" + driver.HomeDir, "TMPDIR=/tmp", "SPEC_VAR=from-posture"},
		Network: "none",
		Mounts: []driver.Mount{
			{Source: t.TempDir(), Target: driver.WorkspaceDir},
			{Source: t.TempDir(), Target: driver.AgentDir, ReadOnly: true},
		},
		Init: []string{driver.AgentPath, "init"},
	}
	return &driver.CreateSpec{
		Key: key, Name: key.ContainerName(), Image: testImage, Posture: p,
		Labels: map[string]string{
			driver.LabelTenant:       key.Tenant,
			driver.LabelUser:         key.User,
			driver.LabelKey:          key.Hex(),
			driver.LabelPosture:      p.Hash(),
			driver.LabelInstallation: installation,
		},
	}
}

func TestConformance(t *testing.T) {
	agent := testutil.AgentBinary(t)
	drivertest.Run(t, drivertest.Harness{
		New:   func(t *testing.T) driver.Driver { return host.New(agent) },
		Image: testImage,
		// The host driver resolves every well-formed ref; only a malformed one is unavailable.
		MissingImage: "sandkeep missing:none",
		Spec:         spec,
	})
}

// running returns a driver, a started sandbox and its workspace directory.
func running(t *testing.T) (*host.Driver, *driver.Sandbox, string) {
	t.Helper()
	d := host.New(testutil.AgentBinary(t))
	key, err := identity.New("host-test", t.Name())
	if err != nil {
		t.Fatal(err)
	}
	s := spec(t, key, "host-test")
	sb, err := d.Create(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Remove(context.Background(), sb) })
	if err := d.Start(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	return d, sb, s.Posture.Mounts[0].Source
}

func request(argv ...string) agentproto.Request {
	return agentproto.Request{
		Version: agentproto.Version, ID: 1, Argv: argv, Workdir: driver.WorkspaceDir,
		TimeoutMS: 60_000, GraceMS: 500, StdoutLimit: agentproto.DefaultLimit, StderrLimit: agentproto.DefaultLimit,
	}
}

func exec(t *testing.T, ctx context.Context, d *host.Driver, sb *driver.Sandbox, req agentproto.Request) (string, agentproto.Result, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	res, err := d.Exec(ctx, sb, req, driver.Output{Stdout: &stdout, Stderr: &stderr})
	if err == nil && res.ExitCode != 0 {
		t.Logf("exit %d, stderr %q", res.ExitCode, stderr.String())
	}
	return stdout.String(), res, err
}

// TestEnvIsExplicit: a command sees the host's PATH, the posture's Env, HOME at the workspace and the request's
// Env, and nothing else from sandkeep's own environment. Not parallel: it sets a variable in this process.
func TestEnvIsExplicit(t *testing.T) {
	const sentinel = "sk-sentinel-3f9a1c"
	t.Setenv("SANDKEEP_TEST_SECRET", sentinel)
	t.Setenv("AWS_SECRET_ACCESS_KEY", sentinel)
	d, sb, ws := running(t)
	req := request("env")
	req.Env = []string{"REQ_VAR=from-request"}
	out, res, err := exec(t, t.Context(), d, sb, req)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("env: %+v, %v", res, err)
	}
	if strings.Contains(out, sentinel) {
		t.Errorf("sandkeep's own environment leaked into the command:\n%s", out)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(line, "=")
		got[k] = v
	}
	want := map[string]string{
		"HOME": ws, "PATH": os.Getenv("PATH"), "TMPDIR": "/tmp", "SPEC_VAR": "from-posture", "REQ_VAR": "from-request",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	// What the agent itself may add (PWD from the shell-less exec is not set) is not sandkeep's; anything else is.
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected variable %s=%q", k, got[k])
		}
	}
}

func TestWorkdir(t *testing.T) {
	d, sb, ws := running(t)
	tests := []struct {
		workdir string
		want    string // the command's directory on the host; "" when refused
	}{
		{driver.WorkspaceDir, ws},
		{driver.WorkspaceDir + "/", ws},
		{"", ws},
		{driver.WorkspaceDir + "/sub/dir", filepath.Join(ws, "sub", "dir")},
		{driver.WorkspaceDir + "/a/../b", filepath.Join(ws, "b")},
		{"/etc", ""},
		{"/", ""},
		{driver.WorkspaceDir + "/../etc", ""},
		{driver.WorkspaceDir + "x", ""},
		{"workspace", ""},
	}
	for _, tc := range tests {
		t.Run(tc.workdir, func(t *testing.T) {
			req := request("pwd")
			req.Workdir = tc.workdir
			out, res, err := exec(t, t.Context(), d, sb, req)
			if tc.want == "" {
				if !errdefs.IsInvalidArgument(err) || fault.CodeOf(err) != fault.InvalidWorkdir {
					t.Fatalf("workdir %q: %q %+v %v; want INVALID_WORKDIR", tc.workdir, out, res, err)
				}
				return
			}
			if err != nil || strings.TrimSpace(out) != tc.want {
				t.Fatalf("workdir %q: pwd %q, %v; want %q", tc.workdir, out, err, tc.want)
			}
		})
	}
}

// TestStopEndsTheCommandTree: Stop during a command ends it (with its descendants), and Exec reports a broken
// channel, as a stopped container would.
func TestStopEndsTheCommandTree(t *testing.T) {
	for _, op := range []string{"stop", "remove"} {
		t.Run(op, func(t *testing.T) {
			d, sb, ws := running(t)
			type result struct {
				res agentproto.Result
				err error
			}
			done := make(chan result, 1)
			go func() {
				// A background child that would outlive its parent if the tree were not killed.
				req := request("sh", "-c", "sleep 30 & echo $! > child.pid; wait")
				res, err := d.Exec(context.Background(), sb, req, driver.Output{})
				done <- result{res, err}
			}()
			pidFile := filepath.Join(ws, "child.pid")
			var pid int
			for deadline := time.Now().Add(20 * time.Second); pid == 0; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the command did not start")
				}
				b, _ := os.ReadFile(pidFile)
				pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			}
			start := time.Now()
			var err error
			if op == "stop" {
				err = d.Stop(t.Context(), sb, time.Second)
			} else {
				err = d.Remove(t.Context(), sb)
			}
			if err != nil {
				t.Fatalf("%s: %v", op, err)
			}
			r := <-done
			if !errors.Is(r.err, agentproto.ErrProtocol) {
				t.Errorf("Exec after %s = %+v, %v; want an ErrProtocol error", op, r.res, r.err)
			}
			if el := time.Since(start); el > 15*time.Second {
				t.Errorf("%s took %v", op, el)
			}
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("the command's child %d survived %s: kill(0) = %v", pid, op, err)
			}
			if _, err := os.Stat(ws); err != nil {
				t.Errorf("workspace touched by %s: %v", op, err)
			}
			if op == "remove" {
				if _, err := d.Inspect(t.Context(), sb.Name); !errdefs.IsNotFound(err) {
					t.Errorf("Inspect after Remove: %v", err)
				}
			}
		})
	}
}

func TestCreateNeedsWorkspace(t *testing.T) {
	d := host.New(testutil.AgentBinary(t))
	key, err := identity.New("host-test", "noworkspace")
	if err != nil {
		t.Fatal(err)
	}
	for name, mounts := range map[string][]driver.Mount{
		"no mount":    nil,
		"missing dir": {{Source: filepath.Join(t.TempDir(), "absent"), Target: driver.WorkspaceDir}},
		"relative":    {{Source: "ws", Target: driver.WorkspaceDir}},
	} {
		t.Run(name, func(t *testing.T) {
			s := spec(t, key, "host-test")
			s.Posture.Mounts = mounts
			if sb, err := d.Create(t.Context(), s); !errdefs.IsInvalidArgument(err) {
				t.Fatalf("Create = %+v, %v; want errdefs.ErrInvalidArgument", sb, err)
			}
		})
	}
}

func TestPing(t *testing.T) {
	if err := host.New(testutil.AgentBinary(t)).Ping(t.Context()); err != nil {
		t.Errorf("Ping with the agent: %v", err)
	}
	for _, agent := range []string{"", "sandkeep-agent", filepath.Join(t.TempDir(), "absent")} {
		if err := host.New(agent).Ping(t.Context()); fault.CodeOf(err) != fault.AgentMissing {
			t.Errorf("Ping with agent %q = %v; want %s", agent, err, fault.AgentMissing)
		}
	}
}

func TestResolveImageIgnoresImages(t *testing.T) {
	d := host.New("/unused")
	for _, ref := range []string{"debian:12", "localhost:1/sandkeep-missing:none", "ghcr.io/x/y@sha256:abc"} {
		if id, err := d.ResolveImage(t.Context(), ref); err != nil || id != host.ImageID {
			t.Errorf("ResolveImage(%q) = %q, %v; want %q", ref, id, err, host.ImageID)
		}
	}
	for _, ref := range []string{"", "a b", "a\nb"} {
		if _, err := d.ResolveImage(t.Context(), ref); fault.CodeOf(err) != fault.ImageUnavailable {
			t.Errorf("ResolveImage(%q) = %v; want IMAGE_UNAVAILABLE", ref, err)
		}
	}
}

func TestNameAndCapabilities(t *testing.T) {
	d := host.New("/unused")
	if d.Name() != "host" {
		t.Errorf("Name = %q", d.Name())
	}
	if c := d.Capabilities(); c != (driver.Capabilities{Persistent: true}) {
		t.Errorf("Capabilities = %+v", c)
	}
}

// TestNewAsRefusesRoot: the host user a server names is never root.
func TestNewAsRefusesRoot(t *testing.T) {
	for _, ids := range [][2]uint32{{0, 0}, {0, 1500}, {1500, 0}} {
		if _, err := host.NewAs("/bin/true", ids[0], ids[1]); fault.CodeOf(err) != fault.InvalidArgument {
			t.Errorf("NewAs(%d:%d) = %v, want INVALID_ARGUMENT", ids[0], ids[1], err)
		}
	}
}
