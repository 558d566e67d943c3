package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/testutil"
	"github.com/sandkeep/sandkeep/internal/testutil/kubetest"
)

// processBound is how long any one sandkeep process may run in these tests before it is killed and the test
// fails: generous, it only turns a hang into a failure.
const processBound = 3 * time.Minute

// cli runs the built sandkeep binary the way a user would, against its own state home (so its own
// installation id and containers, removed when the test ends).
type cli struct {
	bin          string
	home         string
	env          []string
	installation string
	suffix       string // makes this test's tenants unique on the shared engine
	// On kubernetes (SANDKEEP_TEST_DRIVER=kubernetes): the cluster and the test's namespace, where every
	// sandkeep process of this cli runs its sandboxes.
	kc *kubetest.Cluster
	ns string
}

// ten returns a tenant name unique to this cli. Container names derive from (tenant, user) only, and the
// engine is shared by every test (of every package) running at once: a sandbox of the same (tenant, user)
// from another state home would be a FOREIGN_CONTAINER here.
func (c *cli) ten(name string) string { return name + "-" + c.suffix }

// newCLI builds sandkeep and the agent, makes a fresh state home and registers the removal of every container
// of that home's installation.
func newCLI(t *testing.T) *cli {
	t.Helper()
	var kc *kubetest.Cluster
	var ns, image string
	if kubetest.Selected() {
		kc = kubetest.Node(t)
		ns = kc.Namespace(t)
		image = kubetest.Image
	} else {
		testutil.Docker(t)
		image = testutil.TestImage(t)
	}
	agent := testutil.AgentBinary(t)
	bin := testutil.BuildBinary(t, "./cmd/sandkeep", "sandkeep", false)
	home := t.TempDir()
	// scripts/test.sh runs the suite once per transport. Its exec pass reaches every process here; its agent
	// pass does not: the CLI's default, auto, already prefers the channel, and forcing it would fail the tests
	// where several one-shot processes share a sandbox by design (only one can own its channel).
	env := []string{"SANDKEEP_HOME=" + home, "SANDKEEP_IMAGE=" + image, "SANDKEEP_AGENT=" + agent}
	if kc != nil {
		// The cloud host kind picks kubernetes with no flag; no host passthrough to fall back to. The spec keeps
		// each pod's resources small (kubetest.Spec).
		spec := filepath.Join(t.TempDir(), "sandkeep.yaml")
		if err := os.WriteFile(spec, []byte(kubetest.Spec), 0o644); err != nil {
			t.Fatal(err)
		}
		env = append(env, kubeEnv(kc, ns)...)
		env = append(env, "SANDKEEP_SPEC="+spec)
	}
	if os.Getenv("SANDKEEP_TRANSPORT") == "exec" {
		env = append(env, "SANDKEEP_TRANSPORT=exec")
	}
	// scripts/test.sh's runsc pass (SANDKEEP_TEST_RUNTIME=runsc): every sandkeep process runs its sandboxes under
	// that runtime, as an operator's SANDKEEP_RUNTIME would (TestExecRuntime checks the engine's view).
	if rt := testRuntime(); rt != "" && kc == nil {
		env = append(env, "SANDKEEP_RUNTIME="+rt)
	}
	// scripts/test.sh runs this suite in-process (SANDKEEP_TEST_DAEMON unset: SANDKEEP_DAEMON=off) and once more
	// through the home's daemon (SANDKEEP_TEST_DAEMON=auto: the first call starts it, later ones go through it).
	daemonMode := os.Getenv("SANDKEEP_TEST_DAEMON")
	if daemonMode == "" {
		daemonMode = "off"
	}
	env = append(env, "SANDKEEP_DAEMON="+daemonMode, "SANDKEEP_DAEMON_IDLE=5m")
	c := &cli{bin: bin, home: home, env: cleanEnv(env...), kc: kc, ns: ns}
	t.Cleanup(func() { // the home's daemon, if a call started one, ends with the test
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
		defer cancel()
		_, _ = c.exec(ctx, nil, nil, "daemon", "stop")
	})
	// Any command that opens the home creates its installation id; ps touches no container.
	c.run(t, "ps").want(t, 0)
	id, err := os.ReadFile(filepath.Join(home, "installation-id"))
	if err != nil {
		t.Fatalf("installation id: %v", err)
	}
	c.installation = strings.TrimSpace(string(id))
	c.suffix = c.installation[:12]
	if kc == nil {
		testutil.Cleanup(t, c.installation) // on kubernetes the namespace goes, with everything in it
	}
	return c
}

// testRuntime is the sandbox runtime the suite runs under: SANDKEEP_TEST_RUNTIME (scripts/test.sh's runsc pass),
// or "" for the engine's default.
func testRuntime() string { return os.Getenv("SANDKEEP_TEST_RUNTIME") }

// gvisor says whether the suite runs under gVisor (runsc): no agent channel and no network there
// (docs/SECURITY.md, "gVisor").
func gvisor() bool { return testRuntime() == "runsc" }

// kubeEnv is the environment that points sandkeep at namespace ns of the test cluster (the operator's
// variables of docs/KUBERNETES.md).
func kubeEnv(kc *kubetest.Cluster, ns string) []string {
	kubeconfig := os.Getenv("KUBECONFIG")
	if kubeconfig == "" {
		kubeconfig = kubetest.NodeKubeconfig
	}
	return []string{"SANDKEEP_HOST_KIND=cloud", "SANDKEEP_HOST_PASSTHROUGH=deny", "KUBECONFIG=" + kubeconfig,
		kube.EnvNamespace + "=" + ns, kube.EnvAgentImage + "=" + kc.AgentImage,
		kube.EnvStorageClass + "=" + kubetest.StorageClass, kube.EnvWorkspaceSize + "=" + kubetest.WorkspaceSize}
}

// driverName is the driver this cli's sandboxes run on.
func (c *cli) driverName() string {
	if c.kc != nil {
		return kubetest.Driver
	}
	return "docker"
}

// cleanEnv is the test process's environment without any SANDKEEP_ variable, plus extra.
func cleanEnv(extra ...string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "SANDKEEP_") })
	return append(env, extra...)
}

// command returns an unstarted sandkeep process with this home's environment plus extraEnv (later entries
// win). It is killed when ctx ends.
func (c *cli) command(ctx context.Context, extraEnv []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.bin, args...)
	cmd.Env = append(slices.Clone(c.env), extraEnv...)
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// result is what one sandkeep process did.
type result struct {
	args           []string
	stdout, stderr string
	code           int
}

// exec runs sandkeep to completion. It does not touch t, so it may run on any goroutine.
func (c *cli) exec(ctx context.Context, stdin io.Reader, extraEnv []string, args ...string) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, processBound)
	defer cancel()
	cmd := c.command(ctx, extraEnv, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &stdout, &stderr
	err := cmd.Run()
	r := result{args: args, stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.Exited():
		r.code = ee.ExitCode()
	default:
		return r, err
	}
	return r, nil
}

func (c *cli) run(t *testing.T, args ...string) result {
	t.Helper()
	return c.runWith(t, nil, nil, args...)
}

func (c *cli) runWith(t *testing.T, stdin io.Reader, extraEnv []string, args ...string) result {
	t.Helper()
	r, err := c.exec(t.Context(), stdin, extraEnv, args...)
	if err != nil {
		t.Fatalf("sandkeep %q: %v\nstdout: %s\nstderr: %s", args, err, r.stdout, r.stderr)
	}
	return r
}

// want fails the test unless the process exited with code.
func (r result) want(t *testing.T, code int) result {
	t.Helper()
	if r.code != code {
		t.Fatalf("sandkeep %q: exit %d, want %d\nstdout: %s\nstderr: %s", r.args, r.code, code, r.stdout, r.stderr)
	}
	return r
}

// wantFailure checks sandkeep's own failure: exit 125, nothing on stdout, and on stderr
// "sandkeep: CODE: message" followed by a "hint: ..." line.
func (r result) wantFailure(t *testing.T, code string) result {
	t.Helper()
	r.want(t, exitFailure)
	re := regexp.MustCompile(`(?m)^sandkeep: ` + regexp.QuoteMeta(code) + `: \S.*\nhint: \S.*$`)
	if !re.MatchString(r.stderr) {
		t.Fatalf("sandkeep %q: stderr does not say %q with a hint:\n%s", r.args, code, r.stderr)
	}
	if r.stdout != "" {
		t.Fatalf("sandkeep %q: stdout should be empty on a failure, got %q", r.args, r.stdout)
	}
	return r
}

func keyOf(t *testing.T, tenant, user string) sandkeep.Key {
	t.Helper()
	k, err := sandkeep.NewKey(tenant, user)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// workspace is the host directory of (tenant, user)'s /workspace.
// sandboxUID is the uid a sandbox's commands run as, read from the first line of out (a command's `id -u`): a
// number and never root. With per-key uids (the default when the tests run as root) it is the key's own.
func sandboxUID(t *testing.T, out string) string {
	t.Helper()
	line, _, _ := strings.Cut(out, "\n")
	if n, err := strconv.Atoi(line); err != nil || n <= 0 {
		t.Fatalf("id -u in the sandbox printed %q: want a uid other than root", line)
	}
	return line
}

func (c *cli) workspace(t *testing.T, tenant, user string) string {
	if c.kc != nil { // the claim's test volume (a path that does not exist without a claim)
		if dir := c.kc.Workspace(t, c.ns, keyOf(t, tenant, user).ContainerName()); dir != "" {
			return dir
		}
		return filepath.Join(c.home, "no-workspace-claim", keyOf(t, tenant, user).Hex())
	}
	return filepath.Join(c.home, "workspaces", keyOf(t, tenant, user).Hex())
}

// containers lists, straight from the engine, the containers of this home's installation.
func (c *cli) containers(t *testing.T) []string {
	t.Helper()
	// Not t.Context(): this also runs from t.Cleanup, when that context is already cancelled.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if c.kc != nil { // the sandboxes' records (their UIDs are the sandbox IDs)
		opts := c.kc.Options(c.ns)
		opts.ChannelListen = ""
		d, err := kube.New(opts)
		if err != nil {
			t.Fatal(err)
		}
		sbs, err := d.List(ctx, c.installation)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sb := range sbs {
			ids = append(ids, sb.ID)
		}
		return ids
	}
	list, err := testutil.Docker(t).ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: client.Filters{}.Add("label", driver.LabelInstallation+"="+c.installation),
	})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, it := range list.Items {
		ids = append(ids, it.ID)
	}
	return ids
}

// jsonResult mirrors the documented `exec --json` object exactly.
type jsonResult struct {
	ExitCode        int    `json:"exit_code"`
	TimedOut        bool   `json:"timed_out"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	DurationMS      int64  `json:"duration_ms"`
	Transport       string `json:"transport"`
	Sandbox         struct {
		Name   string `json:"name"`
		ID     string `json:"id"`
		Driver string `json:"driver"`
		Tenant string `json:"tenant"`
		User   string `json:"user"`
	} `json:"sandbox"`
}

var jsonResultFields = []string{"exit_code", "timed_out", "stdout", "stderr", "stdout_truncated",
	"stderr_truncated", "duration_ms", "transport", "sandbox"}

// decodeOne decodes s as exactly one JSON object into v, refusing unknown fields, and checks that the
// object has exactly the top-level fields want.
func decodeOne(t *testing.T, s string, v any, want []string) {
	t.Helper()
	decodeJSON(t, s, v)
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &fields); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range fields {
		got = append(got, k)
	}
	slices.Sort(got)
	want = slices.Sorted(slices.Values(want))
	if !slices.Equal(got, want) {
		t.Fatalf("JSON fields %v, want %v in %s", got, want, s)
	}
}

// decodeJSON decodes s as exactly one JSON value into v, refusing unknown fields.
func decodeJSON(t *testing.T, s string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("more than one JSON value in %q", s)
	}
}

// jsonErr mirrors `{"error": {...}}`.
type jsonErr struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Hint    string `json:"hint"`
	} `json:"error"`
}

func (r result) wantJSONError(t *testing.T, code string) {
	t.Helper()
	r.want(t, exitFailure)
	var e jsonErr
	decodeOne(t, r.stdout, &e, []string{"error"})
	if e.Error.Code != code || e.Error.Message == "" || e.Error.Hint == "" {
		t.Fatalf("sandkeep %q: error %+v, want code %s with a message and a hint", r.args, e.Error, code)
	}
}

// blocker is a sandkeep exec process whose command holds its key's gate until released: it prints
// "started" once running, then waits for a file the test creates in its workspace. Nothing in it depends on
// how long anything takes.
type blocker struct {
	cmd    *exec.Cmd
	ws     string
	stdout *bufio.Reader
	stderr *bytes.Buffer
	exited chan struct{}
	err    error // valid once exited is closed
}

func (c *cli) startBlocker(t *testing.T, tenant, user string, extraArgs ...string) *blocker {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), processBound)
	args := append([]string{"exec", "--tenant", tenant, "--user", user, "--timeout", "2m"}, extraArgs...)
	args = append(args, "--", "sh", "-c", `echo started; while [ ! -e /workspace/release ]; do sleep 0.05; done; echo released`)
	b := &blocker{
		cmd: c.command(ctx, nil, args...), ws: c.workspace(t, tenant, user),
		stdout: bufio.NewReader(pr), stderr: &bytes.Buffer{}, exited: make(chan struct{}),
	}
	b.cmd.Stdout, b.cmd.Stderr = pw, b.stderr
	if err := b.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	pw.Close()
	go func() {
		defer cancel()
		b.err = b.cmd.Wait()
		close(b.exited)
	}()
	t.Cleanup(func() {
		b.release(t)
		<-b.exited
		pr.Close()
	})
	line, err := b.stdout.ReadString('\n')
	if line != "started\n" {
		<-b.exited
		t.Fatalf("blocker for %s/%s: read %q, %v (exit: %v)\nstderr: %s", tenant, user, line, err, b.err, b.stderr)
	}
	b.wantRunning(t)
	return b
}

// wantRunning fails the test when the blocker's sandkeep has already exited. It cannot have exited normally:
// its command waits for release.
func (b *blocker) wantRunning(t *testing.T) {
	t.Helper()
	select {
	case <-b.exited:
		t.Fatalf("blocker exited before it was released: %v\nstderr: %s", b.err, b.stderr)
	default:
	}
}

func (b *blocker) release(t *testing.T) {
	if err := os.WriteFile(filepath.Join(b.ws, "release"), nil, 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("release blocker: %v", err)
	}
}

// finish releases the blocker and checks that its command then ends normally.
func (b *blocker) finish(t *testing.T) {
	t.Helper()
	b.release(t)
	rest, _ := io.ReadAll(b.stdout)
	<-b.exited
	if b.err != nil || string(rest) != "released\n" {
		t.Fatalf("blocker: exit %v, rest of stdout %q\nstderr: %s", b.err, rest, b.stderr)
	}
}
