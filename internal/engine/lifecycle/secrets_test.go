package lifecycle

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/spec"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

func TestCheckSecrets(t *testing.T) {
	big := make([]byte, MaxSecretBytes+1)
	half := make([]byte, MaxSecretBytes/2+1)
	tests := []struct {
		name    string
		secrets []Secret
		wantErr string // "" for valid
	}{
		{name: "none"},
		{name: "one", secrets: []Secret{{Name: "t", Path: "/run/secrets/token", Value: []byte("v")}}},
		{name: "nested and explicit mode", secrets: []Secret{{Path: "/run/secrets/npm/rc", Mode: 0o440}, {Path: "/run/secrets/token"}}},
		{name: "outside the tmpfs", secrets: []Secret{{Path: "/workspace/token"}}, wantErr: "not under /run/secrets"},
		{name: "the tmpfs itself", secrets: []Secret{{Path: "/run/secrets"}}, wantErr: "not under /run/secrets"},
		{name: "prefix without a slash", secrets: []Secret{{Path: "/run/secretsX"}}, wantErr: "not under /run/secrets"},
		{name: "relative", secrets: []Secret{{Path: "run/secrets/token"}}, wantErr: "not a clean absolute path"},
		{name: "dot-dot", secrets: []Secret{{Path: "/run/secrets/../../etc/passwd"}}, wantErr: "not a clean absolute path"},
		{name: "trailing slash", secrets: []Secret{{Path: "/run/secrets/token/"}}, wantErr: "not a clean absolute path"},
		{name: "control character", secrets: []Secret{{Path: "/run/secrets/to\nken"}}, wantErr: "control character"},
		{name: "empty path", secrets: []Secret{{}}, wantErr: "not a clean absolute path"},
		{name: "mode with type bits", secrets: []Secret{{Path: "/run/secrets/t", Mode: fs.ModeSymlink | 0o400}}, wantErr: "mode"},
		{name: "mode the owner cannot read", secrets: []Secret{{Path: "/run/secrets/t", Mode: 0o200}}, wantErr: "mode"},
		{name: "same path twice", secrets: []Secret{{Path: "/run/secrets/t"}, {Path: "/run/secrets/t"}}, wantErr: "collides"},
		{name: "a path under another", secrets: []Secret{{Path: "/run/secrets/t"}, {Path: "/run/secrets/t/x"}}, wantErr: "collides"},
		{name: "too big", secrets: []Secret{{Path: "/run/secrets/t", Value: big}}, wantErr: "over"},
		{name: "the CA bundle's directory", secrets: []Secret{{Path: "/run/secrets/.sandkeep"}}, wantErr: "CA bundle"},
		{name: "over the CA bundle", secrets: []Secret{{Path: AgentCABundlePath}}, wantErr: "CA bundle"},
		{name: "too big together", secrets: []Secret{{Path: "/run/secrets/a", Value: half}, {Path: "/run/secrets/b", Value: half}}, wantErr: "add up"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkSecrets(tt.secrets)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("checkSecrets: %v", err)
				}
				return
			}
			if !fault.Is(err, fault.InvalidArgument) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("checkSecrets = %v, want INVALID_ARGUMENT with %q", err, tt.wantErr)
			}
		})
	}
}

// TestSecretRefusedBeforeAnythingRuns: a bad secret fails Exec before the gate, the ensure and the command.
func TestSecretRefusedBeforeAnythingRuns(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	k := key(t, "acme", "alice")
	req, _ := sh(`echo ran > ran.txt`)
	req.Secrets = []Secret{{Name: "token", Path: "/workspace/token", Value: []byte("v")}}
	var got []string
	req.OnEvent = func(name string, _ any) { got = append(got, name) }
	if _, err := m.Exec(t.Context(), k, req); !fault.Is(err, fault.InvalidArgument) {
		t.Fatalf("Exec with a secret outside /run/secrets = %v, want INVALID_ARGUMENT", err)
	}
	if n := e.drv.Calls(fake.OpCreate) + e.drv.Calls(fake.OpExec); n != 0 || e.count() != 0 || len(got) != 0 {
		t.Fatalf("something ran: %d create/exec calls, %d sandboxes, events %v", n, e.count(), got)
	}
}

// TestSecretNeverPrinted: a Secret (and a request carrying one) printed, logged or marshalled shows no value.
func TestSecretNeverPrinted(t *testing.T) {
	const value = "sentinel-value-never-printed"
	s := Secret{Name: "token", Path: "/run/secrets/token", Mode: 0o400, Value: []byte(value)}
	req := ExecRequest{Argv: []string{"true"}, Secrets: []Secret{s}}
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	log.Info("x", "secret", s, "secrets", req.Secrets)
	slog.New(slog.NewTextHandler(&logs, nil)).Info("x", "secret", s)
	js, err := json.Marshal(req.Secrets)
	if err != nil {
		t.Fatal(err)
	}
	out := fmt.Sprint(s) + fmt.Sprintf("%v %+v %#v %s %v %+v", s, s, s, s, req, req) + logs.String() + string(js)
	if strings.Contains(out, value) || strings.Contains(out, hex.EncodeToString([]byte(value))) {
		t.Fatalf("the value was printed: %s", out)
	}
	if !strings.Contains(out, "/run/secrets/token") {
		t.Fatalf("the description lost the path: %s", out)
	}
}

// TestPostureMountsSecretsTmpfs: every sandbox has the secrets tmpfs, owned by the sandbox user, whatever the run.
func TestPostureMountsSecretsTmpfs(t *testing.T) {
	p, err := BuildPosture(Config{Image: "x", AgentPath: "/a", User: "1234:5678"}, "/ws", "/agent", "")
	if err != nil {
		t.Fatal(err)
	}
	want := "rw,noexec,nosuid,nodev,size=1m,uid=1234,gid=5678,mode=0700"
	if got := p.Tmpfs[spec.SecretsDir]; got != want {
		t.Fatalf("tmpfs %s = %q, want %q", spec.SecretsDir, got, want)
	}
}

// TestSecretFilesDocker delivers a sentinel secret through the real engine on both transports and searches every
// output sandkeep and the engine produce for it.
func TestSecretFilesDocker(t *testing.T) {
	cli := testutil.Docker(t)
	// Close only drops the shared client's idle connections (goleak watches this package); it keeps working.
	t.Cleanup(func() { _ = cli.Close() })
	image := testutil.TestImage(t)
	agent := testutil.AgentBinary(t)
	transports := []Transport{TransportAgent, TransportExec}
	if os.Getenv("SANDKEEP_TEST_RUNTIME") == RuntimeGVisor { // the runsc pass: no agent channel there
		transports = []Transport{TransportExec}
	}
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			w := newSecretWorld(t, cli, image, agent, tr)
			w.run(t)
		})
	}
}

type secretWorld struct {
	cli      *client.Client
	m        *Manager
	home     *Home
	homeDir  string
	key      identity.Key
	sentinel string

	logs lockedBuffer

	mu     sync.Mutex
	events []string // each event, rendered
	seen   []string // outputs to search for the sentinel, with what they are
}

func newSecretWorld(t *testing.T, cli *client.Client, image, agent string, tr Transport) *secretWorld {
	t.Helper()
	w := &secretWorld{cli: cli, homeDir: t.TempDir()}
	home, err := OpenHome(w.homeDir)
	if err != nil {
		t.Fatal(err)
	}
	w.home = home
	testutil.Cleanup(t, home.Installation)
	log := slog.New(slog.NewTextHandler(&w.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m, err := New(home, docker.NewWithEngine(cli, docker.Options{}), Config{Image: image, AgentPath: agent, Transport: tr, Logger: log,
		Runtime: os.Getenv("SANDKEEP_TEST_RUNTIME")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	w.m = m
	w.key = key(t, "acme", "secrets-"+string(tr))
	var rnd [16]byte
	_, _ = rand.Read(rnd[:])
	w.sentinel = "sk-sentinel-" + hex.EncodeToString(rnd[:])
	return w
}

func (w *secretWorld) sink(name string, payload any) {
	js, _ := json.Marshal(payload)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events = append(w.events, fmt.Sprintf("%s %+v %#v %s", name, payload, payload, js))
}

func (w *secretWorld) keep(what, s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, what+": "+s)
}

func (w *secretWorld) secret(path string) Secret {
	return Secret{Name: filepath.Base(path), Path: path, Mode: 0o400, Value: []byte(w.sentinel)}
}

// exec runs script with secrets and returns its stdout and stderr (kept for the search unless noKeep).
func (w *secretWorld) exec(ctx context.Context, script string, timeout time.Duration, secrets ...Secret) (*ExecResult, string, string, error) {
	var stdout, stderr bytes.Buffer
	res, err := w.m.Exec(ctx, w.key, ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: timeout,
		Stdout: &stdout, Stderr: &stderr, OnEvent: w.sink, Secrets: secrets})
	if err != nil {
		w.keep("error", fmt.Sprintf("%v | %+v | %#v", err, err, err))
	}
	return res, stdout.String(), stderr.String(), err
}

// ok runs script and fails the test unless it exits 0; its output is kept for the search.
func (w *secretWorld) ok(t *testing.T, script string, secrets ...Secret) (*ExecResult, string) {
	t.Helper()
	res, out, errOut, err := w.exec(t.Context(), script, 0, secrets...)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec(%q): %+v, %v; stdout %q stderr %q", script, res, err, out, errOut)
	}
	w.keep("stdout of "+script, out)
	w.keep("stderr of "+script, errOut)
	return res, out
}

// noSecretFiles checks that the secrets tmpfs holds nothing (no file, no temporary file) after an Exec.
func (w *secretWorld) noSecretFiles(t *testing.T, when string) {
	t.Helper()
	if _, out := w.ok(t, `ls -A /run/secrets`); out != "" {
		t.Errorf("%s: /run/secrets still holds %q", when, out)
	}
}

func (w *secretWorld) run(t *testing.T) {
	const token = "/run/secrets/token"

	// 1. Delivered, read, owned by the sandbox user with mode 0400, invisible in every process's environ and
	// cmdline (dumped to stderr, which is searched below), and gone afterwards.
	script := `cat ` + token + `; echo; ls -ln ` + token + `; stat -c '%u:%g %a' ` + token + `
grep ' /run/secrets ' /proc/mounts
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$f"; echo " <- $f"; done >&2`
	var stdout, stderr bytes.Buffer
	first, err := w.m.Exec(t.Context(), w.key, ExecRequest{Argv: []string{"sh", "-c", script}, Stdout: &stdout,
		Stderr: &stderr, OnEvent: w.sink, Secrets: []Secret{w.secret(token)}})
	if err != nil || first.ExitCode != 0 {
		t.Fatalf("Exec with a secret: %+v, %v; stdout %q stderr %q", first, err, stdout.String(), stderr.String())
	}
	lines := strings.Split(stdout.String(), "\n")
	if len(lines) < 4 || lines[0] != w.sentinel {
		t.Fatalf("the command did not read the secret: stdout %q", stdout.String())
	}
	// The sandbox user: the key's own uid of the default range (sandkeep runs as root here).
	_, uid, gid, err := w.m.Workspace(w.key, false)
	if err != nil {
		t.Fatal(err)
	}
	u, g := strconv.Itoa(uid), strconv.Itoa(gid)
	if f := strings.Fields(lines[1]); len(f) < 4 || f[0] != "-r--------" || f[2] != u || f[3] != g {
		t.Errorf("ls -ln: %q, want -r-------- owned by %s:%s", lines[1], u, g)
	}
	if lines[2] != u+":"+g+" 400" {
		t.Errorf("stat: %q, want %s:%s 400", lines[2], u, g)
	}
	opts := []string{"tmpfs", "noexec", "nosuid", "nodev", "mode=700", "uid=" + u, "gid=" + g}
	if os.Getenv("SANDKEEP_TEST_RUNTIME") == RuntimeGVisor {
		// gVisor's /proc/mounts lists neither nosuid nor nodev and writes the mode as mode=0700.
		opts = []string{"tmpfs", "noexec", "mode=0700", "uid=" + u, "gid=" + g}
	}
	for _, opt := range opts {
		if !strings.Contains(lines[3], opt) {
			t.Errorf("mount %q lacks %s", lines[3], opt)
		}
	}
	if !strings.Contains(stderr.String(), "/proc/1/environ") || !strings.Contains(stderr.String(), "HOME=") {
		t.Errorf("the /proc dump read nothing: %q", stderr.String())
	}
	w.keep("/proc environ and cmdline", stderr.String())
	w.keep("the rest of stdout", strings.Join(lines[1:], "\n"))

	// Events are about the user's command only: one exec_started (its argv) and one exec_finished.
	w.mu.Lock()
	var started, finished int
	for _, ev := range w.events {
		started += b2i(strings.HasPrefix(ev, events.NameExecStarted+" "))
		finished += b2i(strings.HasPrefix(ev, events.NameExecFinished+" "))
		if strings.Contains(ev, "put-file") || strings.Contains(ev, "rm-file") {
			t.Errorf("an event names a file helper: %s", ev)
		}
	}
	w.mu.Unlock()
	if started != 1 || finished != 1 {
		t.Errorf("%d exec_started and %d exec_finished, want 1 and 1: %v", started, finished, w.events)
	}

	second, _ := w.ok(t, `test ! -e `+token)
	if second.Sandbox.ID != first.Sandbox.ID {
		t.Errorf("a run without secrets recycled the sandbox: %s then %s", first.Sandbox.ID, second.Sandbox.ID)
	}
	w.noSecretFiles(t, "after a successful command")

	// 2. A failing command, a command past its deadline, a cancelled command: the files go all the same.
	if res, _, _, err := w.exec(t.Context(), `exit 3`, 0, w.secret(token)); err != nil || res.ExitCode != 3 {
		t.Fatalf("failing command: %+v, %v", res, err)
	}
	w.noSecretFiles(t, "after a failing command")
	if res, _, _, err := w.exec(t.Context(), `sleep 30`, time.Second, w.secret(token)); err != nil || !res.TimedOut {
		t.Fatalf("command past its deadline: %+v, %v", res, err)
	}
	w.noSecretFiles(t, "after a timed-out command")
	w.cancelled(t, token)
	w.noSecretFiles(t, "after a cancelled command")

	// 3. A symlink planted at the path (toward /workspace, on the host's disk) is replaced, not written through.
	w.ok(t, `ln -s /workspace/leak `+token)
	if _, out := w.ok(t, `cat `+token+` >/dev/null && test -f `+token+` && test ! -L `+token+` && test ! -e /workspace/leak && echo replaced`,
		w.secret(token)); out != "replaced\n" {
		t.Errorf("a planted symlink: %q", out)
	}
	w.noSecretFiles(t, "after replacing a symlink")

	// 4. A symlinked directory is refused: SECRET_DELIVERY_FAILED, the command does not run, and the secret
	// placed before it is removed.
	w.ok(t, `ln -s /workspace /run/secrets/dir`)
	res, _, _, err := w.exec(t.Context(), `touch /workspace/ran`, 0, w.secret("/run/secrets/first"), w.secret("/run/secrets/dir/token"))
	if !fault.Is(err, SecretDeliveryFailed) || res != nil {
		t.Fatalf("placing through a symlinked directory = %+v, %v; want SECRET_DELIVERY_FAILED", res, err)
	}
	if exists(filepath.Join(w.home.Workspace(w.key), "ran")) || exists(filepath.Join(w.home.Workspace(w.key), "token")) {
		t.Error("the command ran, or the secret went through the symlink into the workspace")
	}
	if _, out := w.ok(t, `ls -A /run/secrets`); out != "dir\n" {
		t.Errorf("after a failed placement /run/secrets holds %q, want only the planted symlink", out)
	}
	w.ok(t, `rm /run/secrets/dir`)

	// 5. A command that leaves something the agent cannot remove at a secret's path (here a directory that is
	// not empty, after copying the secret into it) gets its sandbox recycled: the secret does not outlive it.
	before, _ := w.ok(t, `true`)
	w.ok(t, `mv `+token+` /run/secrets/moved && mkdir `+token+` && mv /run/secrets/moved `+token+`/x`, w.secret(token))
	after, _ := w.ok(t, `ls -A /run/secrets`)
	if after.Sandbox.ID == before.Sandbox.ID {
		t.Error("a sandbox whose secret files could not be removed was kept")
	}
	w.mu.Lock()
	recycled := strings.Contains(strings.Join(w.events, "\n"), events.NameSandboxRecycled+" ")
	w.mu.Unlock()
	if !recycled {
		t.Error("no sandbox_recycled event for the sandbox whose secrets could not be removed")
	}
	w.noSecretFiles(t, "after a recycle")

	w.search(t)
}

// cancelled starts a command with a secret, cancels it once it runs, and checks Exec's answer.
func (w *secretWorld) cancelled(t *testing.T, token string) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	marker := filepath.Join(w.home.Workspace(w.key), "started")
	go func() {
		for !exists(marker) && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}()
	res, _, _, err := w.exec(ctx, `touch started; sleep 30`, 0, w.secret(token))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled command: %+v, %v; want context.Canceled", res, err)
	}
	_ = os.Remove(marker)
}

// search looks for the sentinel in every output: the engine's inspect and logs, the logger, the events, the
// errors and outputs kept, and every file under the sandkeep home (the workspace included).
func (w *secretWorld) search(t *testing.T) {
	ctx := t.Context()
	name := w.key.ContainerName()
	ins, err := w.cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.keep("docker inspect", string(ins.Raw))
	logs, err := w.cli.ContainerLogs(ctx, name, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		t.Fatal(err)
	}
	var lout, lerr bytes.Buffer
	_, err = stdcopy.StdCopy(&lout, &lerr, logs)
	logs.Close()
	if err != nil {
		t.Fatal(err)
	}
	w.keep("docker logs", lout.String()+lerr.String())
	w.keep("logger", w.logs.String())
	if !strings.Contains(w.logs.String(), "ensure") {
		t.Errorf("the logger captured nothing: %q", w.logs.String())
	}
	files := 0
	err = filepath.WalkDir(w.homeDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("read %s: %v", p, err)
		}
		files++
		w.keep("file "+p, string(b))
		return nil
	})
	if err != nil || files == 0 {
		t.Fatalf("walked %d files under the home: %v", files, err)
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.events) == 0 {
		t.Fatal("no events recorded")
	}
	all := append(append([]string(nil), w.seen...), w.events...)
	hexed := hex.EncodeToString([]byte(w.sentinel))
	b64 := base64.StdEncoding.EncodeToString([]byte(w.sentinel))
	for _, s := range all {
		if strings.Contains(s, w.sentinel) || strings.Contains(s, hexed) || strings.Contains(s, b64) {
			what, _, _ := strings.Cut(s, ": ")
			t.Errorf("the sentinel appears in %s", what)
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// lockedBuffer is an io.Writer safe for the manager's goroutines and the test to share.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var _ io.Writer = (*lockedBuffer)(nil)
