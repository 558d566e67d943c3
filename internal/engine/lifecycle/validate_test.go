package lifecycle

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestExecValidatesBeforeTouchingDriver: a workdir outside the workspace folder, or a request the agent's wire
// refuses, is refused with its code before any gate, image, inspect or create. (What a user's command may be is
// the engine's one validator's: sandkeep's TestExecRequestCheck.)
func TestExecValidatesBeforeTouchingDriver(t *testing.T) {
	argv := []string{"true"}
	tests := []struct {
		name string
		req  ExecRequest
		want fault.Code
	}{
		{"workdir dotdot", ExecRequest{Argv: argv, Workdir: "../x"}, fault.InvalidWorkdir},
		{"workdir absolute outside", ExecRequest{Argv: argv, Workdir: "/etc"}, fault.InvalidWorkdir},
		{"workdir escapes through workspace", ExecRequest{Argv: argv, Workdir: "/workspace/../etc"}, fault.InvalidWorkdir},
		{"workdir inner dotdot", ExecRequest{Argv: argv, Workdir: "src/../../etc"}, fault.InvalidWorkdir},
		{"workdir proc fd", ExecRequest{Argv: argv, Workdir: "/proc/self/fd/3"}, fault.InvalidWorkdir},
		{"workdir proc inside", ExecRequest{Argv: argv, Workdir: "/workspace/proc/self/cwd"}, fault.InvalidWorkdir},
		{"workdir root", ExecRequest{Argv: argv, Workdir: "/"}, fault.InvalidWorkdir},
		{"workdir control char", ExecRequest{Argv: argv, Workdir: "a\nb"}, fault.InvalidWorkdir},
		{"env without equals", ExecRequest{Argv: argv, Env: []string{"TOKEN"}}, fault.InvalidArgument},
		{"env empty name", ExecRequest{Argv: argv, Env: []string{"=x"}}, fault.InvalidArgument},
		{"empty argv", ExecRequest{}, fault.InvalidArgument},
		{"empty program", ExecRequest{Argv: []string{"", "x"}}, fault.InvalidArgument},
		{"negative stdout limit", ExecRequest{Argv: argv, StdoutLimit: -1}, fault.InvalidArgument},
		{"huge stderr limit", ExecRequest{Argv: argv, StderrLimit: 1 << 40}, fault.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			m := e.manager()
			k := key(t, "acme", "alice")
			res, err := m.Exec(t.Context(), k, tt.req)
			if got := fault.CodeOf(err); got != tt.want {
				t.Fatalf("Exec = %+v, %v; want code %s", res, err, tt.want)
			}
			for _, op := range []fake.Op{fake.OpResolve, fake.OpInspect, fake.OpCreate, fake.OpStart, fake.OpExec} {
				if n := e.drv.Calls(op); n != 0 {
					t.Errorf("driver %s called %d times for a refused request", op, n)
				}
			}
			if exists(e.home.Workspace(k)) {
				t.Errorf("a refused request created the workspace")
			}
			if n := waiters(m, k); n != 0 {
				t.Errorf("a refused request left %d gate waiters", n)
			}
		})
	}
}

// TestExecAcceptsBounds: the edges of what is valid do run.
func TestExecAcceptsBounds(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	k := key(t, "acme", "alice")
	tests := []struct {
		name string
		req  ExecRequest
		want string
	}{
		{"relative workdir", ExecRequest{Workdir: "src/app"}, "/src/app\n"},
		{"absolute workdir", ExecRequest{Workdir: "/workspace/lib"}, "/lib\n"},
		{"timeout 1s", ExecRequest{Timeout: time.Second}, "/\n"},
		{"timeout 24h", ExecRequest{Timeout: 24 * time.Hour}, "/\n"},
		{"env", ExecRequest{Env: []string{"GREETING=hi there"}}, "/\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, out := sh(`p=$(pwd); echo "${p#"$WS"}"`, append([]string{"WS=" + e.home.Workspace(k)}, tt.req.Env...)...)
			req.Workdir, req.Timeout = tt.req.Workdir, tt.req.Timeout
			res, err := m.Exec(t.Context(), k, req)
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("Exec = %+v, %v", res, err)
			}
			got := out.String()
			if got == "\n" {
				got = "/\n"
			}
			if got != tt.want {
				t.Errorf("ran in %q, want %q", got, tt.want)
			}
		})
	}
}

func TestNewValidatesConfig(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *Config)
		want   fault.Code // "" when New must succeed
	}{
		{"defaults", func(*Config) {}, ""},
		{"root user", func(c *Config) { c.User = "0:0" }, fault.PostureRefused},
		{"root group", func(c *Config) { c.User = "1000:0" }, fault.PostureRefused},
		{"root uid", func(c *Config) { c.User = "0:1000" }, fault.PostureRefused},
		{"root allowed", func(c *Config) { c.User, c.AllowRoot = "0:0", true }, ""},
		{"user not numeric", func(c *Config) { c.User = "sandbox" }, fault.InvalidArgument},
		{"user negative", func(c *Config) { c.User = "-1:1000" }, fault.InvalidArgument},
		{"no image", func(c *Config) { c.Image = "" }, fault.InvalidArgument},
		{"no agent", func(c *Config) { c.AgentPath = "" }, fault.AgentMissing},
		{"agent missing", func(c *Config) { c.AgentPath = filepath.Join(c.AgentPath, "nope") }, fault.AgentMissing},
		{"bad base env", func(c *Config) { c.Env = []string{"NOEQUALS"} }, fault.InvalidEnv},
		{"mount over the workspace", func(c *Config) {
			c.Mounts = []driver.Mount{{Source: "/tmp", Target: driver.WorkspaceDir}}
		}, fault.InvalidMount},
		{"workspace folder /etc", func(c *Config) { c.WorkspaceFolder = "/etc/app" }, fault.InvalidMount},
		{"workspace folder relative", func(c *Config) { c.WorkspaceFolder = "workspaces/app" }, fault.InvalidMount},
		{"workspace folder root", func(c *Config) { c.WorkspaceFolder = "/" }, fault.InvalidMount},
		{"workspace folder over /usr", func(c *Config) { c.WorkspaceFolder = "/usr" }, fault.InvalidMount},
		{"workspace folder in the agent's directory", func(c *Config) { c.WorkspaceFolder = driver.AgentDir + "/app" }, fault.InvalidMount},
		{"volume over /proc", func(c *Config) { c.Volumes = []Volume{{Name: "v", Target: "/proc/x"}} }, fault.InvalidMount},
		{"volume name", func(c *Config) { c.Volumes = []Volume{{Name: "../v", Target: "/cache"}} }, fault.InvalidMount},
		{"volumes on one target", func(c *Config) {
			c.Volumes = []Volume{{Name: "a", Target: "/cache"}, {Name: "b", Target: "/cache"}}
		}, fault.InvalidMount},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config()
			tt.mutate(&cfg)
			m, err := New(e.home, e.drv, cfg)
			if got := fault.CodeOf(err); got != tt.want {
				t.Fatalf("New = %v, %v; want code %q", m, err, tt.want)
			}
			if tt.want == "" {
				if _, err := m.Exec(t.Context(), key(t, "acme", "alice"), ExecRequest{Argv: []string{"true"}}); err != nil {
					t.Errorf("Exec after a valid New: %v", err)
				}
				return
			}
			if n := e.drv.Calls(fake.OpResolve) + e.drv.Calls(fake.OpPing); n != 0 {
				t.Errorf("refused config touched the driver %d times", n)
			}
			if strings.TrimSpace(err.Error()) == string(tt.want)+":" {
				t.Errorf("error has no message: %q", err)
			}
		})
	}
}
