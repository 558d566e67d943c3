package main

import (
	"crypto/md5"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// noDocker points the Docker driver at a socket that does not exist: no sandboxing driver is usable.
var noDocker = []string{"DOCKER_HOST=unix:///nonexistent/sandkeep-test/docker.sock"}

type runRecord struct {
	ID          string `json:"id"`
	Tenant      string `json:"tenant"`
	User        string `json:"user"`
	Trust       string `json:"trust"`
	Requested   string `json:"requested_mode"`
	Resolved    string `json:"resolved_mode"`
	Src         string `json:"source"`
	Drv         string `json:"driver"`
	Admission   string `json:"admission"`
	Status      string `json:"status"`
	FailureCode string `json:"failure_code"`
	Disposition string `json:"disposition"`
	CreatedAt   string `json:"created_at"`
	FinishedAt  string `json:"finished_at"`
}

type eventRecord struct {
	Seq     int64           `json:"seq"`
	RunID   string          `json:"run_id"`
	Name    string          `json:"name"`
	Payload json.RawMessage `json:"payload"`
}

// lastRun is the newest run recorded in c's home, and its events.
func (c *cli) lastRun(t *testing.T) (runRecord, []eventRecord) {
	t.Helper()
	var runs []runRecord
	decodeJSON(t, c.run(t, "runs", "--json", "--limit", "1").want(t, 0).stdout, &runs)
	if len(runs) != 1 {
		t.Fatalf("runs: %+v", runs)
	}
	evs := c.eventsOf(t, runs[0].ID)
	return runs[0], evs
}

func names(evs []eventRecord) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Name)
	}
	return out
}

// TestDegradeOrRefuse: with no usable sandboxing driver, auto runs on the host loudly and records why, inline
// refuses deterministically, and an untrusted run is refused; each leaves a run record and its events.
func TestDegradeOrRefuse(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	ten := c.ten("acme")

	r := c.runWith(t, nil, noDocker, "exec", "--tenant", ten, "--user", "u", "--sandbox", "auto", "--", "echo", "on-host").want(t, 0)
	if r.stdout != "on-host\n" || !strings.Contains(r.stderr, "UNSANDBOXED") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Errorf("auto degrade: stdout %q, stderr %q (want one loud line)", r.stdout, r.stderr)
	}
	run, evs := c.lastRun(t)
	if run.Admission != "admitted" || run.Status != "succeeded" || run.Drv != "host" || run.Resolved != "auto" || run.Src != "cli" {
		t.Errorf("auto degrade run: %+v", run)
	}
	if n := names(evs); len(n) == 0 || n[0] != "sandbox_skipped" || strings.Contains(string(evs[0].Payload), `"refused"`) {
		t.Errorf("auto degrade events: %v %s", n, evs[0].Payload)
	}

	// A forced agent transport is about sandboxes: a run degraded to the host still runs.
	c.runWith(t, nil, noDocker, "--transport", "agent", "exec", "--tenant", ten, "--user", "u", "--sandbox", "auto", "--", "true").want(t, 0)

	c.runWith(t, nil, noDocker, "exec", "--tenant", ten, "--user", "u", "--sandbox", "inline", "--", "true").wantFailure(t, "SANDBOX_DRIVER_UNAVAILABLE")
	run, evs = c.lastRun(t)
	if run.Admission != "refused" || run.Status != "failed" || run.FailureCode != "SANDBOX_DRIVER_UNAVAILABLE" || run.Disposition != "deterministic" {
		t.Errorf("inline refusal run: %+v", run)
	}
	if len(evs) != 1 || evs[0].Name != "sandbox_skipped" || !strings.Contains(string(evs[0].Payload), `"refused":true`) {
		t.Errorf("inline refusal events: %+v", evs)
	}

	r = c.runWith(t, nil, noDocker, "exec", "--tenant", ten, "--user", "u", "--trust", "untrusted", "--", "true").wantFailure(t, "UNTRUSTED_WITHOUT_SANDBOX")
	if !strings.Contains(r.stderr, "default") {
		t.Errorf("the refusal must name the tier that decided (the built-in default): %s", r.stderr)
	}
	c.runWith(t, nil, append(noDocker[:1:1], "SANDKEEP_SANDBOX_DEFAULT=inline"),
		"exec", "--tenant", ten, "--user", "u", "--", "true").wantFailure(t, "SANDBOX_DRIVER_UNAVAILABLE")
	if run, _ := c.lastRun(t); run.Src != "env" || run.Resolved != "inline" {
		t.Errorf("env tier: %+v", run)
	}

	// An explicit none is silent by design: no warning, no sandbox_skipped event.
	r = c.runWith(t, nil, noDocker, "exec", "--tenant", ten, "--user", "u", "--sandbox", "none", "--", "echo", "plain").want(t, 0)
	if r.stderr != "" {
		t.Errorf("mode none printed %q", r.stderr)
	}
	if _, evs := c.lastRun(t); len(evs) > 0 && evs[0].Name == "sandbox_skipped" {
		t.Errorf("mode none recorded sandbox_skipped")
	}
	c.runWith(t, nil, noDocker, "exec", "--tenant", ten, "--user", "u", "--sandbox", "none", "--trust", "untrusted", "--", "true").
		wantFailure(t, "UNTRUSTED_WITHOUT_SANDBOX")
	c.runWith(t, nil, noDocker, "exec", "--tenant", ten, "--user", "u", "--driver", "docker", "--", "true").
		wantFailure(t, "SANDBOX_DRIVER_UNAVAILABLE")
}

// TestSpecAndDevcontainer: a spec without an image takes it from the repository's devcontainer.json; the
// repository's credential-looking env is stripped, recorded by name only, and never reaches the sandbox.
func TestSpecAndDevcontainer(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	repo := t.TempDir()
	if err := os.MkdirAll(filepath.Join(repo, ".devcontainer"), 0o755); err != nil {
		t.Fatal(err)
	}
	const secret = "ghp_sentinelSecretValue123"
	dc := `{
  // a repository's own description of its container
  "image": "` + testutil.TestImage(t) + `",
  "containerEnv": {"FROM_REPO": "repo-value", "GITHUB_TOKEN": "` + secret + `",},
}`
	if err := os.WriteFile(filepath.Join(repo, ".devcontainer", "devcontainer.json"), []byte(dc), 0o644); err != nil {
		t.Fatal(err)
	}
	specFile := filepath.Join(repo, "sandkeep.yaml")
	if err := os.WriteFile(specFile, []byte("sandbox:\n  mode: inline\n  env: {FROM_SPEC: spec-value}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := c.run(t, "exec", "--spec", specFile, "--tenant", c.ten("acme"), "--user", "dev", "--",
		"sh", "-c", `echo "$FROM_REPO $FROM_SPEC ${GITHUB_TOKEN:-stripped}"`).want(t, 0)
	if r.stdout != "repo-value spec-value stripped\n" {
		t.Errorf("env in the sandbox: %q", r.stdout)
	}
	run, evs := c.lastRun(t)
	if run.Drv != "docker" || run.Src != "spec" || run.Resolved != "inline" {
		t.Errorf("run: %+v", run)
	}
	all := c.run(t, "events", "--json").want(t, 0).stdout
	if strings.Contains(all, secret) {
		t.Fatal("a repository secret's value reached the event log")
	}
	if n := names(evs); len(n) < 3 || n[0] != "sandbox_env_denied" || !strings.Contains(string(evs[0].Payload), "GITHUB_TOKEN") {
		t.Errorf("events: %v", n)
	}

	// What this build cannot apply is refused, never silently dropped.
	bad := filepath.Join(repo, "hoststate.yaml")
	os.WriteFile(bad, []byte("sandbox:\n  image: x\n  host_state: auto\n"), 0o644)
	tmpfsSpec := filepath.Join(repo, "tmpfs.yaml")
	os.WriteFile(tmpfsSpec, []byte("sandbox:\n  mode: inline\n  tmpfs: [\"/cache:size=8m\"]\n"), 0o644)
	r = c.run(t, "exec", "--spec", tmpfsSpec, "--tenant", c.ten("acme"), "--user", "tmp", "--",
		"sh", "-c", "id -u && echo x > /cache/f && stat -c '%u' /cache && df -k /cache | tail -1").want(t, 0)
	if uid := sandboxUID(t, r.stdout); !strings.HasPrefix(r.stdout, uid+"\n"+uid+"\n") || !strings.Contains(r.stdout, "8192") {
		t.Errorf("spec tmpfs: %q (want owned by the sandbox's uid %s, 8 MiB)", r.stdout, uid)
	}
	r = c.run(t, "exec", "--spec", bad, "--user", "dev", "--", "true").wantFailure(t, "TIER_REFUSED")
	if !strings.Contains(r.stderr, "SK510") || !strings.Contains(r.stderr, "sandbox.host_state") {
		t.Errorf("host_state from a repository: %s", r.stderr)
	}
	broken := filepath.Join(repo, "broken.yaml")
	os.WriteFile(broken, []byte("sandbox:\n  mode: allowlist\n"), 0o644)
	r = c.run(t, "exec", "--spec", broken, "--user", "dev", "--", "true").wantFailure(t, "SPEC_INVALID")
	if !strings.Contains(r.stderr, "SK102") || !strings.Contains(r.stderr, ":2:") {
		t.Errorf("diagnostic without code or line: %s", r.stderr)
	}
}

// squash collapses runs of spaces: doctor pads its columns to its longest check name, which new checks change.
func squash(s string) string {
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == ' ' }), " ")
}

// TestDoctor: exit 0 when everything passes, 1 with a fix line for a broken spec, 2 for bad usage.
func TestDoctor(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	r := c.run(t, "doctor").want(t, 0)
	// The engine here is Docker 20.10 (SK401: its default profile allows io_uring; ours is applied), sandboxes
	// run under runc (under runsc in scripts/test.sh's runsc pass: SK405, which says what gVisor takes away), and
	// per-key uids are on (the tests run as root).
	runtime := "PASS  sandbox runtime  runc"
	if gvisor() {
		runtime = "WARN  sandbox runtime  SK405: gVisor (runsc)"
		if !strings.Contains(r.stdout, "no host-socket agent channel") || !strings.Contains(r.stdout, "go through the relay") || !strings.Contains(r.stdout, "EGRESS_UNAVAILABLE") {
			t.Errorf("doctor under runsc does not say there is no host-socket agent channel, that processes go through the relay, and that networked commands are refused:\n%s", r.stdout)
		}
	}
	for _, want := range []string{"host kind", "local", "Docker 20", "docker;", "auto, from default",
		"WARN  engine seccomp   SK401: Docker 20", runtime, "PASS  user namespaces",
		"PASS  sandbox uids     each key's sandbox runs as a host uid of its own from 200000-265535",
		// Builds get a pids-limited cgroup here (cgroupfs, root) but the engine's own seccomp (issue 22, finding 3).
		"WARN  build limits     SK410: builds' RUN steps run under the engine's default seccomp profile"} {
		if !strings.Contains(squash(r.stdout), squash(want)) {
			t.Errorf("doctor output lacks %q:\n%s", want, r.stdout)
		}
	}
	for env, want := range map[string]string{
		"SANDKEEP_SANDBOX_UIDS=off": "WARN  sandbox uids     SK408: per-key host uids are off (the operator turned them off)",
		"SANDKEEP_RUNTIME=kata":     "FAIL  sandbox runtime  SK404: sandboxes ask for runtime \"kata\"",
	} {
		if r := c.runWith(t, nil, []string{env}, "doctor"); !strings.Contains(squash(r.stdout), squash(want)) {
			t.Errorf("doctor with %s lacks %q:\n%s", env, want, r.stdout)
		}
	}
	broken := filepath.Join(t.TempDir(), "sandkeep.yaml")
	os.WriteFile(broken, []byte("sandbox:\n  image: a\n  build: {dockerfile: Dockerfile}\n"), 0o644)
	r = c.run(t, "doctor", "--strict", "--spec", broken).want(t, 1)
	if !strings.Contains(r.stdout, "FAIL") || !strings.Contains(r.stdout, "SK103") || !strings.Contains(r.stdout, "fix:") {
		t.Errorf("doctor --strict on a broken spec:\n%s", r.stdout)
	}
	c.run(t, "doctor", "--strict", "--image", "localhost:1/absent:none").want(t, 1)
	if r := c.run(t, "doctor", "--seccomp-profile").want(t, 0); !strings.Contains(r.stdout, `"defaultAction":"SCMP_ACT_ERRNO"`) {
		t.Errorf("doctor --seccomp-profile:\n%.200s", r.stdout)
	}
	seccompDir := t.TempDir() // what deploy/kubernetes/seccomp-profile.yaml's DaemonSet writes on a node
	c.run(t, "doctor", "--seccomp-install", seccompDir).want(t, 0)
	if b, err := os.ReadFile(filepath.Join(seccompDir, kube.SeccompLocalhostProfile())); err != nil || string(b) != driver.SeccompProfile() {
		t.Errorf("doctor --seccomp-install: %v, %.80q", err, b)
	}
	c.run(t, "doctor", "--timeout", "0").want(t, 2)
	c.run(t, "doctor", "--no-such-flag").want(t, 2) // a usage error is 2, as doctor documents, not 125
	r = c.runWith(t, nil, noDocker, "doctor", "--sandbox", "inline").want(t, 1)
	if !strings.Contains(r.stdout, "inline refuses") {
		t.Errorf("doctor without docker:\n%s", r.stdout)
	}
}

// TestNamedRun: commands attach to a run opened with `runs start`; it stays open until `runs finish`, keeps the
// trust it started with (a command's --trust cannot raise it), and a finished run takes no more commands.
func TestNamedRun(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	ten := c.ten("acme")
	id := strings.TrimSpace(c.run(t, "runs", "start", "--tenant", ten, "--user", "wf", "--trust", "untrusted").want(t, 0).stdout)
	for range 2 {
		c.run(t, "exec", "--run", id, "--tenant", ten, "--user", "wf", "--", "true").want(t, 0)
	}
	// The run's trust and mode hold: a command that asks for others is refused, whatever it says.
	r := c.run(t, "exec", "--run", id, "--tenant", ten, "--user", "wf", "--trust", "trusted", "--sandbox", "none", "--", "true").
		wantFailure(t, "INVALID_ARGUMENT")
	if !strings.Contains(r.stderr, "--sandbox") || !strings.Contains(r.stderr, "--trust") {
		t.Errorf("the refusal must name the flags it will not obey: %s", r.stderr)
	}
	c.run(t, "exec", "--run", id, "--tenant", ten, "--user", "other", "--", "true").wantFailure(t, "INVALID_ARGUMENT")

	var runs []runRecord
	decodeJSON(t, c.run(t, "runs", "--json").want(t, 0).stdout, &runs)
	if len(runs) != 1 || runs[0].ID != id || runs[0].Status != "running" || runs[0].Trust != "untrusted" {
		t.Fatalf("runs: %+v", runs)
	}
	evs := c.run(t, "events", "--run", id, "--json").want(t, 0).stdout
	if n := strings.Count(evs, `"exec_finished"`); n != 2 {
		t.Errorf("%d exec_finished events in the run, want 2", n)
	}
	c.run(t, "runs", "finish", id).want(t, 0)
	c.run(t, "exec", "--run", id, "--tenant", ten, "--user", "wf", "--", "true").wantFailure(t, "INVALID_ARGUMENT")
	c.run(t, "runs", "finish", id).wantFailure(t, "INVALID_ARGUMENT")
}

// TestSpecBuild: a spec's build: is built through the engine (no pull, no network), used for the sandbox, and
// recorded; the same inputs reuse the image.
func TestSpecBuild(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	repo := t.TempDir()
	files := map[string]string{
		"Dockerfile":    "FROM " + testutil.TestImage(t) + "\nARG GREETING\nCOPY hello.txt /hello.txt\nRUN echo \"$GREETING\" > /greeting\n",
		"hello.txt":     "from the build context\n",
		"sandkeep.yaml": "sandbox:\n  mode: inline\n  build: {dockerfile: Dockerfile, context: ., args: {GREETING: hi}}\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(repo, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	spec := filepath.Join(repo, "sandkeep.yaml")
	r := c.run(t, "exec", "--spec", spec, "--tenant", c.ten("acme"), "--user", "b", "--", "cat", "/hello.txt", "/greeting").want(t, 0)
	if r.stdout != "from the build context\nhi\n" || !strings.Contains(r.stderr, "build: ") {
		t.Fatalf("stdout %q, stderr %q", r.stdout, r.stderr)
	}
	_, evs := c.lastRun(t)
	if n := names(evs); len(n) < 2 || n[0] != "sandbox_build_started" || n[1] != "sandbox_build_finished" {
		t.Fatalf("events: %v", n)
	}
	var fin struct{ Image string }
	json.Unmarshal(evs[1].Payload, &fin)
	t.Cleanup(func() { testutil.RemoveImage(t, fin.Image) })
	c.run(t, "exec", "--spec", spec, "--tenant", c.ten("acme"), "--user", "b", "--", "true").want(t, 0)

	escape := filepath.Join(repo, "escape.yaml")
	os.WriteFile(escape, []byte("sandbox:\n  build: {dockerfile: ../Dockerfile}\n"), 0o644)
	c.run(t, "exec", "--spec", escape, "--user", "b", "--", "true").wantFailure(t, "SPEC_INVALID")
}

// TestSpecSecretFiles: a secret the operator defines and the repository's spec names reaches the command as a
// file on the sandbox's tmpfs, is gone after it, and its value appears in no output sandkeep writes. A
// repository that names a secret's source itself is refused, and so is an operator source in a credentials
// directory.
func TestSpecSecretFiles(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	dir := t.TempDir()
	sentinel := "sk-sentinel-" + c.suffix
	specFile := filepath.Join(dir, "sandkeep.yaml")
	os.WriteFile(specFile, []byte("sandbox:\n  mode: inline\n  secret_files: [{name: token, path: /run/secrets/token}]\n"), 0o644)
	operator := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	os.WriteFile(operator, []byte("secrets:\n  token: {from_env: TEST_TOKEN}\n"), 0o644)
	ten := c.ten("acme")
	sum := fmt.Sprintf("%x", md5.Sum([]byte(sentinel)))
	r := c.runWith(t, nil, []string{"TEST_TOKEN=" + sentinel, "SANDKEEP_CONFIG=" + operator}, "exec", "--spec", specFile, "--tenant", ten, "--user", "s", "--",
		"sh", "-c", "md5sum /run/secrets/token; stat -c '%a %u' /run/secrets/token; id -u").want(t, 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], sum) || lines[1] != "400 "+lines[2] {
		t.Fatalf("secret in the sandbox: %q (want md5 %s, mode 400, owned by the sandbox user)", r.stdout, sum)
	}
	after := c.run(t, "exec", "--tenant", ten, "--user", "s", "--", "sh", "-c", "ls /run/secrets | wc -l").want(t, 0)
	if strings.TrimSpace(after.stdout) != "0" {
		t.Errorf("secrets left after the run: %q", after.stdout)
	}
	for _, out := range []string{r.stderr, after.stdout, c.run(t, "events", "--json").stdout, c.run(t, "runs", "--json").stdout} {
		if strings.Contains(out, sentinel) {
			t.Fatal("the secret's value reached sandkeep's output")
		}
	}
	c.runWith(t, nil, []string{"SANDKEEP_CONFIG=" + operator}, "exec", "--spec", specFile, "--tenant", ten, "--user", "s", "--", "true").
		wantFailure(t, "SECRET_UNAVAILABLE")
	// Without the operator's definition, the name means nothing.
	c.run(t, "exec", "--spec", specFile, "--tenant", ten, "--user", "s", "--", "true").wantFailure(t, "TIER_REFUSED")

	ssh := filepath.Join(dir, ".ssh")
	os.MkdirAll(ssh, 0o700)
	os.WriteFile(filepath.Join(ssh, "id_rsa"), []byte("PRIVATE"), 0o600)
	stolen := filepath.Join(dir, "stolen.yaml")
	os.WriteFile(stolen, []byte("sandbox:\n  secret_files: [{name: k, path: /run/secrets/k, from_file: "+filepath.Join(ssh, "id_rsa")+"}]\n"), 0o644)
	r = c.runWith(t, nil, []string{"TEST_TOKEN=" + sentinel}, "exec", "--spec", stolen, "--tenant", ten, "--user", "s", "--", "true").
		wantFailure(t, "TIER_REFUSED")
	if !strings.Contains(r.stderr, "SK504") || strings.Contains(r.stderr, "PRIVATE") {
		t.Errorf("a repository naming a host file: %s", r.stderr)
	}
	envSpec := filepath.Join(dir, "env.yaml")
	os.WriteFile(envSpec, []byte("sandbox:\n  secret_files: [{name: k, path: /run/secrets/k, from_env: TEST_TOKEN}]\n"), 0o644)
	r = c.runWith(t, nil, []string{"TEST_TOKEN=" + sentinel}, "exec", "--spec", envSpec, "--tenant", ten, "--user", "s", "--", "true").
		wantFailure(t, "TIER_REFUSED")
	if !strings.Contains(r.stderr, "secrets:") || strings.Contains(r.stderr, sentinel) {
		t.Errorf("a repository naming a host variable: %s", r.stderr)
	}
	badOperator := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	os.WriteFile(badOperator, []byte("secrets:\n  k: {from_file: "+filepath.Join(ssh, "id_rsa")+"}\n"), 0o644)
	c.runWith(t, nil, []string{"SANDKEEP_CONFIG=" + badOperator}, "exec", "--tenant", ten, "--user", "s", "--", "true").
		wantFailure(t, "INVALID_ARGUMENT")
}

// TestExecNetwork: the spec's network block and the command's flags give the command a proxy; a credential's
// value stays on the host; a credential whose variable is unset is refused before anything runs.
func TestExecNetwork(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	// Its calls vary the operator environment (SANDKEEP_CONFIG) per call, which the daemon does not take from a
	// caller (docs/DAEMON.md): they run in-process, and so do the others, so that one process serves a sandbox's
	// network at a time.
	c.env = append(c.env, "SANDKEEP_DAEMON=off")
	repo := t.TempDir()
	specFile := filepath.Join(repo, "sandkeep.yaml")
	spec := "sandbox:\n  mode: inline\n  image: " + testutil.TestImage(t) + "\n  network:\n    mode: allowlist\n    preset: default\n" +
		"    credentials: [{name: API_TOKEN}]\n"
	if err := os.WriteFile(specFile, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	// The credential's source and hosts are the operator's; the repository only names it.
	operator := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	os.WriteFile(operator, []byte("credentials:\n  API_TOKEN: {from_env: SK_TEST_CRED, hosts: [api.example.test]}\n"), 0o644)
	const secret = "sentinel-cred-8c1f"
	r := c.runWith(t, nil, []string{"SK_TEST_CRED=" + secret, "SANDKEEP_CONFIG=" + operator}, "exec", "--spec", specFile, "--tenant", c.ten("acme"), "--user", "net",
		"--", "sh", "-c", `echo "$HTTPS_PROXY|$API_TOKEN|$SSL_CERT_FILE"; grep -c CERTIFICATE /.sandkeep-chan/ca-bundle.pem`)
	if gvisor() {
		// Under gVisor (scripts/test.sh's runsc pass) there is no way to the egress proxy: every networked command
		// is refused before it runs, naming gVisor, and the network flags are still checked first.
		if r.wantFailure(t, "EGRESS_UNAVAILABLE"); !strings.Contains(r.stderr, "gVisor") || strings.Contains(r.stdout+r.stderr, secret) {
			t.Errorf("a networked command under gVisor: %s", r.stderr)
		}
		c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "flags", "--allow", "example.test", "--", "true").wantFailure(t, "EGRESS_UNAVAILABLE")
		if r := c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "flags", "--", "sh", "-c", `echo "[$HTTP_PROXY]"`).want(t, 0); r.stdout != "[]\n" {
			t.Errorf("no network flags: %q", r.stdout)
		}
		c.run(t, "exec", "--user", "flags", "--allow", "a..b", "--", "true").wantFailure(t, "NETWORK_INVALID")
		c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "flags", "--network-preset", "corp", "--", "true").wantFailure(t, "NETWORK_INVALID")
		c.run(t, "exec", "--user", "flags", "--network", "strict", "--", "true").wantFailure(t, "NETWORK_INVALID")
		return
	}
	r.want(t, 0)
	parts := strings.Split(strings.SplitN(r.stdout, "\n", 2)[0], "|")
	if len(parts) != 3 || !strings.HasPrefix(parts[0], "http://sandkeep:") || !strings.HasSuffix(parts[0], "@127.0.0.1:3128") ||
		parts[1] == "" || parts[1] == secret || parts[2] != "/.sandkeep-chan/ca-bundle.pem" {
		t.Errorf("the command's environment: %q", r.stdout)
	}
	if strings.Contains(r.stdout+r.stderr, secret) {
		t.Error("the credential's value reached the sandbox")
	}
	// A spec with a network block passes doctor --strict on Docker (its driver enforces network policy), and so
	// the preflight lets the command run.
	opEnv := []string{"SK_TEST_CRED=" + secret, "SANDKEEP_CONFIG=" + operator}
	if d := c.runWith(t, nil, opEnv, "doctor", "--strict", "--spec", specFile); d.code != 0 || !strings.Contains(d.stdout, "network policy") {
		t.Errorf("doctor --strict on a spec with a network block: exit %d\n%s", d.code, d.stdout)
	}
	c.runWith(t, nil, append(opEnv, "SANDKEEP_PREFLIGHT=1"), "exec", "--spec", specFile, "--tenant", c.ten("acme"), "--user", "net",
		"--", "true").want(t, 0)
	c.runWith(t, nil, []string{"SANDKEEP_CONFIG=" + operator}, "exec", "--spec", specFile, "--tenant", c.ten("acme"), "--user", "net", "--", "true").
		wantFailure(t, "SECRET_UNAVAILABLE")

	// Flags only: rules on a sandbox without a network make an allowlist for this command.
	r = c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "flags", "--allow", "example.test", "--", "sh", "-c", `echo "[$HTTP_PROXY]"`).want(t, 0)
	if !strings.Contains(r.stdout, "@127.0.0.1:3128]") {
		t.Errorf("--allow: %q", r.stdout)
	}
	r = c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "flags", "--", "sh", "-c", `echo "[$HTTP_PROXY]"`).want(t, 0)
	if r.stdout != "[]\n" {
		t.Errorf("no network flags: %q", r.stdout)
	}
	c.run(t, "exec", "--user", "flags", "--allow", "a..b", "--", "true").wantFailure(t, "NETWORK_INVALID")

	// The operator's presets come from $SANDKEEP_CONFIG.
	r = c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "flags", "--network-preset", "corp", "--", "true").wantFailure(t, "NETWORK_INVALID")
	if !strings.Contains(r.stderr, `"corp"`) || !strings.Contains(r.stderr, "default") {
		t.Errorf("unknown preset: %s", r.stderr)
	}
	operator = filepath.Join(repo, "sandkeep-server.yaml")
	if err := os.WriteFile(operator, []byte("network: {presets: {corp: [\"**.corp.example\"]}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.runWith(t, nil, []string{"SANDKEEP_CONFIG=" + operator}, "exec", "--tenant", c.ten("acme"), "--user", "flags",
		"--network-preset", "corp", "--", "true").want(t, 0)
	c.run(t, "exec", "--user", "flags", "--network", "strict", "--", "true").wantFailure(t, "NETWORK_INVALID")
}

// TestPreflightValues: SANDKEEP_PREFLIGHT takes 1, true, yes or on in any case (each runs the checks, which
// refuse here: no engine), off leaves it off, a value it does not know is refused rather than read as off, and a
// warning of the checks is printed while the command runs.
func TestPreflightValues(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	ten := c.ten("acme")
	for _, v := range []string{"1", "true", "TRUE", "yes", "Yes", "on", "ON"} {
		c.runWith(t, nil, append(noDocker[:1:1], "SANDKEEP_PREFLIGHT="+v), "exec", "--tenant", ten, "--user", "pre", "--", "true").
			wantFailure(t, "PREFLIGHT_FAILED")
	}
	c.runWith(t, nil, append(noDocker[:1:1], "SANDKEEP_PREFLIGHT=off"), "exec", "--tenant", ten, "--user", "pre", "--", "true").want(t, 0)
	c.runWith(t, nil, []string{"SANDKEEP_PREFLIGHT=enabled"}, "exec", "--tenant", ten, "--user", "pre", "--", "true").
		wantFailure(t, "INVALID_ARGUMENT")
	r := c.runWith(t, nil, []string{"SANDKEEP_PREFLIGHT=yes", "SANDKEEP_SANDBOX_UIDS=off"}, "exec", "--tenant", ten, "--user", "pre", "--", "echo", "ran").want(t, 0)
	if r.stdout != "ran\n" || !strings.Contains(r.stderr, "sandkeep: preflight: WARN sandbox uids") {
		t.Errorf("a preflight warning: stdout %q, stderr %q", r.stdout, r.stderr)
	}
}
