package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/engine"
	"github.com/sandkeep/sandkeep/internal/fault"
)

func TestServerConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", `listen: 127.0.0.1:9000
shutdown_grace: 5s
sweep: {interval: 10s, idle_timeout: 5m, retention: 1h}
limits: {max_sandboxes: 3, max_concurrent_execs: 2, requests_per_second: 1.5, burst: 4}
tenants: {acme: {max_concurrent_execs: 1}}
max_body: 2Mi
files: {max_file: 10MiB, max_tar: 1g, max_tar_entries: 50}
network: {presets: {corp: ["**.corp.example"]}, silent: [t.example]}
`)
	c, err := loadServerConfig(good)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:9000" || c.shutdownGrace() != 5*time.Second || duration(c.Sweep.Interval, 0) != 10*time.Second || c.Limits.api().Burst != 4 ||
		c.tenantLimits()["acme"].MaxConcurrentExecs != 1 || size(c.MaxBody) != 2<<20 ||
		c.fileLimits().MaxFileBytes != 10<<20 || c.fileLimits().MaxTarEntries != 50 ||
		len(c.Network.Presets["corp"]) != 1 || c.Network.Silent[0] != "t.example" {
		t.Errorf("config = %+v", c)
	}
	if c, err := loadServerConfig(""); err != nil || c.shutdownGrace() != 30*time.Second {
		t.Errorf("no config: %+v, %v", c, err)
	}
	for _, tt := range []struct{ body, want string }{
		{"listn: x\n", "field listn not found"},
		{"max_body: lots\n", "max_body"},
		{"shutdown_grace: soon\n", "shutdown_grace"},
		{"sweep: {interval: -1s}\n", "sweep.interval"},
		{"tls: {cert: a.pem}\n", "both cert and key"},
		{"tenants: {acme: {burst: -2}}\n", "tenants.acme"}, // -1 is unlimited
		{"limits: [1]\n", "cannot unmarshal"},
	} {
		_, err := loadServerConfig(write("bad.yaml", tt.body))
		if fault.CodeOf(err) != fault.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v, want INVALID_ARGUMENT mentioning %q", tt.body, err, tt.want)
		}
	}
	if _, err := loadServerConfig(filepath.Join(dir, "absent.yaml")); fault.CodeOf(err) != fault.InvalidArgument {
		t.Errorf("absent file: %v", err)
	}
}

// TestServeConfigRefused: sandkeep serve --config refuses, before it touches anything, a file that the operator
// tier's strict decoding refuses (tier.DecodeOperator: a YAML alias, a key given twice, two documents, an unknown
// field), exiting 125 with the line. $SANDKEEP_CONFIG, which the CLI and the daemon read, goes through the same
// loadServerConfig.
func TestServeConfigRefused(t *testing.T) {
	t.Setenv(envConfig, "") // serve --config sets it for the processes it starts; restored after the test
	dir := t.TempDir()
	for _, tt := range []struct{ name, body, want string }{
		{"alias", "network:\n  presets:\n    corp: &corp [a.example]\n    more: *corp\n", `line 4: YAML alias \*corp`},
		{"duplicate key", "listen: 127.0.0.1:1\nmax_body: 1m\nlisten: 127.0.0.1:2\n", `line 3: mapping key "listen" already defined at line 1`},
		{"two documents", "listen: 127.0.0.1:1\n---\nlisten: 127.0.0.1:2\n", `line 2: a second YAML document`},
		{"unknown field", "listen: 127.0.0.1:1\nlimits:\n  max_sandbox: 3\n", `line 3: field max_sandbox not found`},
		{"duplicate operator key", "secrets: {a: {from_env: A}}\nsecrets: {b: {from_env: B}}\n", `line 2: mapping key "secrets" already`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-")+".yaml")
			if err := os.WriteFile(file, []byte(tt.body), 0o600); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), []string{"serve", "--config", file, "--listen", "127.0.0.1:0"}, strings.NewReader(""), &stdout, &stderr)
			if code != 125 {
				t.Fatalf("exit %d, want 125\nstderr: %s", code, &stderr)
			}
			match(t, "stderr", `^sandkeep: INVALID_ARGUMENT: server config `+regexp.QuoteMeta(file)+`: (?s:.*)`+tt.want+`(?s:.*)\nhint: `, stderr.String())
		})
	}
	// The CLI reads the same file from $SANDKEEP_CONFIG through the same decoding.
	file := filepath.Join(dir, "alias.yaml")
	t.Setenv(envConfig, file)
	t.Setenv("SANDKEEP_HOME", t.TempDir())
	t.Setenv("SANDKEEP_DAEMON", "off")
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"exec", "--user", "a", "--", "true"}, strings.NewReader(""), &stdout, &stderr); code != 125 {
		t.Fatalf("exec with $SANDKEEP_CONFIG: exit %d, want 125\nstderr: %s", code, &stderr)
	}
	match(t, "stderr", `^sandkeep: INVALID_ARGUMENT: server config .*: line 4: YAML alias \*corp(?s:.*)\nhint: `, stderr.String())
}

// FuzzServerConfig: any file is either a config or an INVALID_ARGUMENT; it never panics, and what it accepts
// has sizes and durations the accessors can use.
func FuzzServerConfig(f *testing.F) {
	f.Add([]byte("listen: 127.0.0.1:7878\nlimits: {max_sandboxes: 3}\n"))
	f.Add([]byte("files: {max_file: 1g}\nmax_body: 64k\nsweep: {interval: 0}\n"))
	f.Add([]byte("network: {presets: {a: [x]}, silent: [y]}\ntenants: {t: {burst: 2}}\n"))
	f.Add([]byte("tls: {cert: a}\n"))
	f.Add([]byte("- a\n- b\n"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := loadServerConfig(p)
		if err != nil {
			if fault.CodeOf(err) != fault.InvalidArgument {
				t.Fatalf("error without INVALID_ARGUMENT: %v", err)
			}
			return
		}
		if size(c.MaxBody) < 0 || c.fileLimits().MaxFileBytes < 0 || c.shutdownGrace() < 0 || duration(c.Sweep.Interval, 0) < 0 {
			t.Fatalf("accepted a negative bound: %+v", c)
		}
	})
}

// TestServeDrivers: a multi-tenant server offers no host passthrough unless its config names the host user,
// never root, and SANDKEEP_HOST_PASSTHROUGH=deny still takes it away (issue 22, High 4).
func TestServeDrivers(t *testing.T) {
	offered := []sandkeep.DriverOption{engine.DriverOption{Name: "docker"}, engine.DriverOption{Name: sandkeep.DriverHost},
		engine.DriverOption{Name: "kubernetes"}}
	hasHost := func(ds []sandkeep.DriverOption) bool {
		return slices.ContainsFunc(ds, func(o sandkeep.DriverOption) bool { return o.Option().Name == sandkeep.DriverHost })
	}
	for _, tc := range []struct {
		name, user, env string
		host            bool
		code            string
	}{
		{name: "default: none", host: false},
		{name: "a named user", user: "1500:1500", host: true},
		{name: "denied by the environment", user: "1500:1500", env: "deny", host: false},
		{name: "root", user: "0:0", code: "INVALID_ARGUMENT"},
		{name: "root group", user: "1500:0", code: "INVALID_ARGUMENT"},
		{name: "a name", user: "nobody", code: "INVALID_ARGUMENT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envHostPassthrough, tc.env)
			var sc serverConfig
			sc.HostPassthrough.User = tc.user
			got, err := sc.serveDrivers(offered)
			if tc.code != "" {
				if string(sandkeep.CodeOf(err)) != tc.code {
					t.Fatalf("serveDrivers = %v, want %s", err, tc.code)
				}
				return
			}
			if err != nil || hasHost(got) != tc.host || len(got) < 2 {
				t.Fatalf("serveDrivers = %v, %v; want the host passthrough: %v", got, err, tc.host)
			}
		})
	}
}

// A template's requests are read with the same sizes as its limits, its suspend_after as a positive duration, and
// a malformed one of either is refused naming it.
func TestServeConfigTemplateRequests(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	body := "templates:\n  small: {cpus: 0.5, memory: 256Mi, requests: {cpus: 0.01, memory: 16MiB}}\n"
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := loadServerConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := c.templates()
	if err != nil {
		t.Fatal(err)
	}
	if r := ts["small"].Requests; r.CPUs != 0.01 || r.MemoryBytes != 16<<20 || ts["small"].MemoryBytes != 256<<20 {
		t.Errorf("template small: %+v", ts["small"])
	}
	c.Templates["small"] = func(tc templateConfig) templateConfig { tc.SuspendAfter = "10m"; return tc }(c.Templates["small"])
	if ts, err := c.templates(); err != nil || ts["small"].SuspendAfter != 10*time.Minute {
		t.Errorf("suspend_after 10m: %+v, %v", ts["small"], err)
	}
	for _, bad := range []string{"soon", "-1m", "0s"} {
		c.Templates["small"] = func(tc templateConfig) templateConfig { tc.SuspendAfter = bad; return tc }(c.Templates["small"])
		if _, err := c.templates(); fault.CodeOf(err) != fault.InvalidArgument || !strings.Contains(err.Error(), "suspend_after") {
			t.Errorf("suspend_after %q: %v, want INVALID_ARGUMENT naming suspend_after", bad, err)
		}
	}
	c.Templates["small"] = func(tc templateConfig) templateConfig { tc.SuspendAfter = ""; tc.Requests.Memory = "lots"; return tc }(c.Templates["small"])
	if _, err := c.templates(); fault.CodeOf(err) != fault.InvalidArgument || !strings.Contains(err.Error(), "requests.memory") {
		t.Errorf("a malformed request: %v, want INVALID_ARGUMENT naming requests.memory", err)
	}
}

// TestServeHostPassthroughUser: end to end, a server whose engine is unreachable refuses an API exec by default,
// and with host_passthrough: {user: "65534:65534"} runs it on the host as that user (uid, gid, no supplementary
// groups), in a workspace handed to that user, which it can reach although the state home was made 0700 (issue
// 22, High 4: the passthrough ran tenants' commands as root; as the named user it could not start at all).
func TestServeHostPassthroughUser(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	acme, globex := c.ten("acme"), c.ten("globex")
	exec := func(s *server, tok, cmd string) (int, string) {
		t.Helper()
		body, _ := json.Marshal(map[string]string{"command": cmd})
		a := s.raw(t, "POST", "/v1/sandboxes/u/exec", tok, bytes.NewReader(body), "Content-Type", "application/json")
		var v struct {
			Stdout   string
			ExitCode int `json:"exit_code"`
		}
		if a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &v) != nil {
			return a.status, a.body
		}
		return v.ExitCode, v.Stdout
	}
	acmeTok, globexTok := c.createToken(t, acme, "t", "").Token, c.createToken(t, globex, "t", "").Token

	closed := c.startServerEnv(t, noDocker)
	if status, body := exec(closed, acmeTok, "id -u"); status != http.StatusServiceUnavailable || !strings.Contains(body, "SANDBOX_DRIVER_UNAVAILABLE") {
		t.Fatalf("exec without an engine and without host_passthrough: %d %s", status, body)
	}

	// The named user must reach its workspace: sandkeep opens the state home and its workspaces/ to it (0711);
	// what is above them is the operator's: t.TempDir's parent is 0700, as /root would be.
	if err := os.Chmod(filepath.Dir(c.home), 0o711); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	if err := os.WriteFile(cfg, []byte("host_passthrough: {user: \"65534:65534\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := c.startServerEnv(t, noDocker, "--config", cfg)
	code, out := exec(s, acmeTok, `echo "$(id -u):$(id -g):$(id -G)"; grep '^Groups:' /proc/self/status; pwd; echo mine > own && stat -c %u:%g own`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 4 || lines[0] != "65534:65534:65534" || strings.TrimSpace(strings.TrimPrefix(lines[1], "Groups:")) != "" ||
		lines[3] != "65534:65534" {
		t.Fatalf("host passthrough as the named user: exit %d, %q", code, out)
	}
	// The workspaces' directory is not listable by the user: a command cannot find the other keys' workspaces.
	if code, out := exec(s, globexTok, "ls "+filepath.Dir(lines[2])); code == 0 || strings.Contains(out, filepath.Base(lines[2])) {
		t.Errorf("globex's command listed the workspaces: exit %d, %q", code, out)
	}
}
