package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// TestCommandLine runs the CLI in-process on command lines that sandkeep must refuse (or answer) before it
// touches the state home or the Docker engine, so no engine is needed.
func TestCommandLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     string // regexp; "" means stdout must be empty
		stderr     string // regexp; "" means stderr must be empty
		jsonOnFail string // the error code expected as JSON on stdout
	}{
		{name: "missing user", args: []string{"exec", "--", "true"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: --user is required\nhint: .*sandkeep exec --help.*\n$`},
		{name: "missing user json", args: []string{"exec", "--json", "--", "true"}, code: 125,
			jsonOnFail: "INVALID_ARGUMENT"},
		{name: "missing user stop", args: []string{"stop"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: --user is required\nhint: .*sandkeep stop --help.*\n$`},
		{name: "missing user rm", args: []string{"rm", "--keep-workspace"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: --user is required\nhint: .*\n$`},
		{name: "no command", args: []string{"exec", "--user", "alice"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: no command given\nhint: .*-- ls -la\n$`},
		{name: "no command after dash", args: []string{"exec", "--user", "alice", "--"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: no command given\n`},
		{name: "unknown flag", args: []string{"exec", "--user", "alice", "--frob", "--", "true"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: unknown flag: --frob\nhint: see 'sandkeep exec --help'\n$`},
		{name: "tty with json", args: []string{"exec", "-it", "--json", "--user", "alice", "--", "sh"}, code: 125,
			jsonOnFail: "INVALID_ARGUMENT"},
		{name: "port-forward missing user", args: []string{"port-forward", "8080"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: --user is required\nhint: .*sandkeep port-forward --help.*\n$`},
		{name: "port-forward bad port", args: []string{"port-forward", "--user", "a", "80:x"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: "80:x" is not a port to forward\nhint: .*\n$`},
		{name: "unknown command", args: []string{"frobnicate"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: unknown command "frobnicate" for "sandkeep"\nhint: see 'sandkeep --help'\n$`},
		{name: "ps takes no args", args: []string{"ps", "alice"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: .*no arguments.*\nhint: see 'sandkeep ps --help'\n$`},
		{name: "bad duration", args: []string{"exec", "--user", "a", "--timeout", "soon", "--", "true"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: invalid argument "soon" for "--timeout" flag.*\nhint: see 'sandkeep exec --help'\n$`},
		{name: "timeout too short", args: []string{"exec", "--user", "a", "--timeout", "0.5s", "--", "true"}, code: 125,
			stderr: `^sandkeep: INVALID_TIMEOUT: timeout 500ms is out of range\nhint: .*1s and 24h.*\n$`},
		{name: "timeout too long", args: []string{"exec", "--user", "a", "--timeout", "25h", "--", "true"}, code: 125,
			stderr: `^sandkeep: INVALID_TIMEOUT: .*\nhint: .*\n$`},
		{name: "timeout zero", args: []string{"exec", "--user", "a", "--timeout", "0", "--", "true"}, code: 125,
			stderr: `^sandkeep: INVALID_TIMEOUT: .*\nhint: .*\n$`},
		{name: "timeout json", args: []string{"exec", "--user", "a", "--json", "--timeout", "25h", "--", "true"}, code: 125,
			jsonOnFail: "INVALID_TIMEOUT"},
		{name: "workdir escape", args: []string{"exec", "--user", "a", "--workdir", "../x", "--", "true"}, code: 125,
			stderr: `^sandkeep: INVALID_WORKDIR: .*\nhint: .*\n$`},
		{name: "workdir proc", args: []string{"exec", "--user", "a", "-w", "/proc/self/fd", "--", "true"}, code: 125,
			stderr: `^sandkeep: INVALID_WORKDIR: .*\nhint: .*\n$`},
		{name: "env without =", args: []string{"exec", "--user", "a", "-e", "BAD", "--", "true"}, code: 125,
			stderr: `^sandkeep: INVALID_ENV: .*\nhint: .*\n$`},
		{name: "env json", args: []string{"exec", "--json", "--user", "a", "-e", "BAD", "--", "true"}, code: 125,
			jsonOnFail: "INVALID_ENV"},
		{name: "bad identity", args: []string{"exec", "--user", "a\x01b", "--", "true"}, code: 125,
			stderr: `^sandkeep: INVALID_IDENTITY: .*\nhint: .*\n$`},
		{name: "output limit zero", args: []string{"exec", "--user", "a", "--output-limit", "0", "--", "true"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: output limit 0B is out of range\nhint: .*\n$`},
		{name: "output limit too big", args: []string{"exec", "--user", "a", "--output-limit", "65MiB", "--", "true"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: output limit 65MiB is out of range\nhint: .*\n$`},
		{name: "gate wait zero", args: []string{"exec", "--user", "a", "--gate-wait", "0s", "--", "true"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: gate wait 0s is not positive\nhint: .*\n$`},
		{name: "sweep interval zero", args: []string{"sweep", "--interval", "0s"}, code: 125,
			stderr: `^sandkeep: INVALID_ARGUMENT: --interval 0s is not positive\nhint: .*\n$`},
		{name: "exec help", args: []string{"exec", "--help"}, code: 0,
			stdout: `(?s)Exit status.*Usage:\n  sandkeep exec --user U .*Examples:.*--timeout duration`},
		{name: "root help", args: []string{"--help"}, code: 0, stdout: `(?s)SANDKEEP_HOME.*exec.*ps.*rm.*stop`},
		{name: "version", args: []string{"version"}, code: 0, stdout: `^sandkeep \S+\n$`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), tt.args, strings.NewReader(""), &stdout, &stderr)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, &stdout, &stderr)
			}
			if tt.jsonOnFail != "" {
				r := result{args: tt.args, stdout: stdout.String(), stderr: stderr.String(), code: code}
				r.wantJSONError(t, tt.jsonOnFail)
				if stderr.Len() != 0 {
					t.Errorf("stderr should be empty with --json, got %q", &stderr)
				}
				return
			}
			match(t, "stdout", tt.stdout, stdout.String())
			match(t, "stderr", tt.stderr, stderr.String())
		})
	}
}

func match(t *testing.T, what, pattern, got string) {
	t.Helper()
	if pattern == "" {
		if got != "" {
			t.Errorf("%s should be empty, got %q", what, got)
		}
		return
	}
	if !regexp.MustCompile(pattern).MatchString(got) {
		t.Errorf("%s does not match %q:\n%s", what, pattern, got)
	}
}

func TestByteSize(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want int64
		str  string
		bad  bool
	}{
		{in: "1048576", want: 1 << 20, str: "1MiB"},
		{in: "100", want: 100, str: "100B"},
		{in: "4kb", want: 4 << 10, str: "4KiB"},
		{in: "64MiB", want: 64 << 20, str: "64MiB"},
		{in: "64Mi", want: 64 << 20, str: "64MiB"}, // the Kubernetes spelling, as everywhere a size is read
		{in: "1.5MiB", want: 1536 << 10, str: "1536KiB"},
		{in: "0", want: 0, str: "0B"},
		{in: "", bad: true},
		{in: " 3 MiB ", bad: true},
		{in: "-1", bad: true},
		{in: "9999999999g", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var b byteSize
			err := b.Set(tt.in)
			if tt.bad {
				if err == nil {
					t.Fatalf("Set(%q) = %d, want an error", tt.in, b)
				}
				return
			}
			if err != nil || int64(b) != tt.want || b.String() != tt.str {
				t.Fatalf("Set(%q) = %d %q, %v; want %d %q", tt.in, b, b.String(), err, tt.want, tt.str)
			}
		})
	}
}
