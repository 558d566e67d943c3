package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
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
max_body: 2m
files: {max_file: 10m, max_tar: 1g, max_tar_entries: 50}
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
	offered := []sandkeep.DriverOption{{Name: "docker"}, {Name: sandkeep.DriverHost}, {Name: "kubernetes"}}
	hasHost := func(ds []sandkeep.DriverOption) bool {
		return slices.ContainsFunc(ds, func(o sandkeep.DriverOption) bool { return o.Name == sandkeep.DriverHost })
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
