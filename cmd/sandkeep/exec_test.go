package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestExec(t *testing.T) {
	t.Parallel()
	c := newCLI(t)

	t.Run("first command", func(t *testing.T) {
		r := c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "alice", "--",
			"sh", "-c", "echo hi > /workspace/f; id -u").want(t, 0)
		uid := sandboxUID(t, r.stdout)
		if st, err := os.Stat(c.workspace(t, c.ten("acme"), "alice")); err != nil || fmt.Sprint(st.Sys().(*syscall.Stat_t).Uid) != uid {
			t.Errorf("the command runs as %s; the workspace on the host: %v, %v", uid, st, err)
		}
		got, err := os.ReadFile(filepath.Join(c.workspace(t, c.ten("acme"), "alice"), "f"))
		if err != nil || string(got) != "hi\n" {
			t.Errorf("workspace file on the host: %q, %v", got, err)
		}
	})

	t.Run("exit status passes through", func(t *testing.T) {
		for _, code := range []int{1, 23, 124, 125, 255} {
			c.run(t, "exec", "--tenant", c.ten("default"), "--user", "codes", "--", "sh", "-c", "exit "+strconv.Itoa(code)).want(t, code)
		}
		// A real exit 124 is the command's, not a timeout: sandkeep says nothing.
		if r := c.run(t, "exec", "--tenant", c.ten("default"), "--user", "codes", "--", "sh", "-c", "exit 124"); r.stderr != "" {
			t.Errorf("stderr %q on a real exit 124", r.stderr)
		}
		c.run(t, "exec", "--tenant", c.ten("default"), "--user", "codes", "--", "sh", "-c", "kill -KILL $$").want(t, 137)
		c.run(t, "exec", "--tenant", c.ten("default"), "--user", "codes", "--", "no-such-command").want(t, 127)
	})

	t.Run("streams stay separate", func(t *testing.T) {
		r := c.run(t, "exec", "--tenant", c.ten("default"), "--user", "streams", "--", "sh", "-c", "echo out; echo err >&2; echo out2").want(t, 0)
		if r.stdout != "out\nout2\n" || r.stderr != "err\n" {
			t.Errorf("stdout %q stderr %q", r.stdout, r.stderr)
		}
	})

	t.Run("flags after the command belong to it", func(t *testing.T) {
		r := c.run(t, "exec", "--tenant", c.ten("default"), "--user", "alice", "echo", "--user", "bob", "-e", "X", "--json").want(t, 0)
		if r.stdout != "--user bob -e X --json\n" {
			t.Errorf("stdout %q", r.stdout)
		}
	})

	t.Run("env", func(t *testing.T) {
		r := c.run(t, "exec", "--tenant", c.ten("default"), "--user", "env", "-e", "FOO=bar", "--env", "SPACED=a b", "-e", "EMPTY=", "--",
			"sh", "-c", `printf '%s|%s|%s|%s' "$FOO" "$SPACED" "${EMPTY-unset}" "$HOME"`).want(t, 0)
		if !strings.HasPrefix(r.stdout, "bar|a b||/") {
			t.Errorf("stdout %q", r.stdout)
		}
	})

	t.Run("stdin", func(t *testing.T) {
		in := "data\nmore data\n"
		r := c.runWith(t, strings.NewReader(in), nil, "exec", "-i", "--tenant", c.ten("default"), "--user", "stdin", "--", "cat").want(t, 0)
		if r.stdout != in {
			t.Errorf("with -i: stdout %q, want %q", r.stdout, in)
		}
		// Without -i the command reads /dev/null, whatever sandkeep's stdin holds.
		r = c.runWith(t, strings.NewReader(in), nil, "exec", "--tenant", c.ten("default"), "--user", "stdin", "--", "cat").want(t, 0)
		if r.stdout != "" {
			t.Errorf("without -i: stdout %q, want nothing", r.stdout)
		}
	})

	t.Run("workdir", func(t *testing.T) {
		r := c.run(t, "exec", "--tenant", c.ten("default"), "--user", "wd", "-w", "src/app", "--", "pwd").want(t, 0)
		if r.stdout != "/workspace/src/app\n" {
			t.Errorf("stdout %q", r.stdout)
		}
	})

	t.Run("output limit", func(t *testing.T) {
		r := c.run(t, "exec", "--tenant", c.ten("default"), "--user", "limit", "--output-limit", "1KiB", "--",
			"sh", "-c", "yes | head -c 100000").want(t, 0)
		if len(r.stdout) != 1024 || !strings.Contains(r.stderr, "truncated at 1KiB") {
			t.Errorf("stdout %d bytes, stderr %q", len(r.stdout), r.stderr)
		}
	})
}

// TestExecStreams checks that output reaches sandkeep's stdout while the command still runs: the command
// prints a line, then waits for a file that the test creates only after reading that line.
func TestExecStreams(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	b := c.startBlocker(t, c.ten("default"), "streamer")
	// The first line came through, and the command is still running (it cannot end before the release).
	b.wantRunning(t)
	b.finish(t)
}

func TestExecTimeout(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	r := c.run(t, "exec", "--tenant", c.ten("default"), "--user", "slow", "--timeout", "1s", "--", "sleep", "30").want(t, exitTimeout)
	if !regexp.MustCompile(`timed out.*process tree was killed`).MatchString(r.stderr) {
		t.Errorf("stderr does not say that the command timed out and its tree was killed: %q", r.stderr)
	}
	// The sandbox stays usable, and nothing of the command is left.
	r = c.run(t, "exec", "--tenant", c.ten("default"), "--user", "slow", "--", "ps", "-o", "pid,args").want(t, 0)
	if strings.Contains(r.stdout, "sleep") {
		t.Errorf("sleep survived its timeout:\n%s", r.stdout)
	}

	for _, d := range []string{"0.5s", "25h"} {
		c.run(t, "exec", "--tenant", c.ten("default"), "--user", "slow", "--timeout", d, "--", "true").wantFailure(t, "INVALID_TIMEOUT")
	}

	var res jsonResult
	r = c.run(t, "exec", "--tenant", c.ten("default"), "--user", "slow", "--json", "--timeout", "1s", "--", "sleep", "30").want(t, exitTimeout)
	decodeOne(t, r.stdout, &res, jsonResultFields)
	if !res.TimedOut {
		t.Errorf("timed_out false in %s", r.stdout)
	}
}

func TestExecFailures(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	tests := []struct {
		name string
		env  []string
		args []string
		code string
		hint string // regexp the hint line must match, when set
	}{
		{name: "missing user", args: []string{"exec", "--tenant", c.ten("acme"), "--", "true"}, code: "INVALID_ARGUMENT"},
		{name: "bad workdir", args: []string{"exec", "--tenant", c.ten("default"), "--user", "a", "--workdir", "../x", "--", "true"}, code: "INVALID_WORKDIR"},
		{name: "bad env", args: []string{"exec", "--tenant", c.ten("default"), "--user", "a", "-e", "BAD", "--", "true"}, code: "INVALID_ENV"},
		{name: "image unavailable", args: []string{"exec", "--tenant", c.ten("default"), "--user", "a", "--image", "localhost:1/none:x", "--", "true"},
			code: "IMAGE_UNAVAILABLE", hint: `(?i)image`},
		{name: "image unavailable from env", env: []string{"SANDKEEP_IMAGE=localhost:1/none:x"},
			args: []string{"exec", "--tenant", c.ten("default"), "--user", "a", "--", "true"}, code: "IMAGE_UNAVAILABLE"},
		{name: "agent missing", env: []string{"SANDKEEP_AGENT=/nonexistent"},
			args: []string{"exec", "--tenant", c.ten("default"), "--user", "a", "--", "true"}, code: "AGENT_MISSING", hint: `SANDKEEP_AGENT`},
		{name: "agent missing flag", args: []string{"--agent", "/nonexistent", "exec", "--tenant", c.ten("default"), "--user", "a", "--", "true"},
			code: "AGENT_MISSING"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := c.runWith(t, nil, tt.env, tt.args...).wantFailure(t, tt.code)
			if tt.hint != "" && !regexp.MustCompile(`(?m)^hint: .*`+tt.hint).MatchString(r.stderr) {
				t.Errorf("hint does not match %q:\n%s", tt.hint, r.stderr)
			}
		})
	}
	// None of these left a sandbox behind.
	t.Cleanup(func() {
		if ids := c.containers(t); len(ids) != 0 {
			t.Errorf("failed commands left containers behind: %v", ids)
		}
	})
}

func TestExecJSON(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	r := c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "jay", "--json", "--",
		"sh", "-c", "echo out; echo err >&2; exit 3").want(t, 3)
	var res jsonResult
	decodeOne(t, r.stdout, &res, jsonResultFields)
	if res.ExitCode != 3 || res.TimedOut || res.Stdout != "out\n" || res.Stderr != "err\n" ||
		res.StdoutTruncated || res.StderrTruncated || res.DurationMS < 0 {
		t.Errorf("result %+v", res)
	}
	sb := res.Sandbox
	if sb.Name != keyOf(t, c.ten("acme"), "jay").ContainerName() || !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(sb.ID) ||
		sb.Driver != "docker" || sb.Tenant != c.ten("acme") || sb.User != "jay" {
		t.Errorf("sandbox %+v", sb)
	}
	if r.stderr != "" {
		t.Errorf("sandkeep's own stderr should be empty, got %q", r.stderr)
	}

	// Without --tenant, the tenant is "default".
	user := "solo-" + c.suffix
	r = c.run(t, "exec", "--user", user, "--json", "--", "true").want(t, 0)
	decodeOne(t, r.stdout, &res, jsonResultFields)
	if res.Sandbox.Tenant != "default" || res.Sandbox.User != user ||
		res.Sandbox.Name != keyOf(t, "default", user).ContainerName() {
		t.Errorf("default tenant: sandbox %+v", res.Sandbox)
	}

	// Output over the limit is cut and flagged.
	r = c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "jay", "--json", "--output-limit", "10", "--",
		"sh", "-c", "echo 0123456789abcdef; echo 0123456789abcdef >&2").want(t, 0)
	decodeOne(t, r.stdout, &res, jsonResultFields)
	if res.Stdout != "0123456789" || !res.StdoutTruncated || res.Stderr != "0123456789" || !res.StderrTruncated {
		t.Errorf("truncated result %+v", res)
	}

	// sandkeep's own failures are one {"error": ...} object on stdout, and exit 125.
	c.run(t, "exec", "--tenant", c.ten("default"), "--user", "jay", "--json", "--workdir", "../x", "--", "true").wantJSONError(t, "INVALID_WORKDIR")
	c.run(t, "exec", "--tenant", c.ten("default"), "--user", "jay", "--json", "--image", "localhost:1/none:x", "--", "true").
		wantJSONError(t, "IMAGE_UNAVAILABLE")
	c.runWith(t, nil, []string{"SANDKEEP_AGENT=/nonexistent"}, "exec", "--tenant", c.ten("default"), "--user", "jay", "--json", "--", "true").
		wantJSONError(t, "AGENT_MISSING")
}

// TestExecInterrupt sends SIGINT or SIGTERM to sandkeep while its command ignores SIGTERM: sandkeep must stop
// the command's whole tree (SIGKILL after the grace), then exit 128+signal, and leave nothing running.
func TestExecInterrupt(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	for _, tt := range []struct {
		name string
		sig  syscall.Signal
		code int
	}{{"SIGINT", syscall.SIGINT, 130}, {"SIGTERM", syscall.SIGTERM, 143}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			user := "sig" + strconv.Itoa(int(tt.sig))
			pr, pw, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			ctx, cancel := context.WithTimeout(t.Context(), processBound)
			defer cancel()
			cmd := c.command(ctx, nil, "exec", "--tenant", c.ten("default"), "--user", user, "--",
				"sh", "-c", `trap "" TERM; echo started; sleep 60 & sleep 61; wait`)
			var stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = pw, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pw.Close()
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			if line, err := bufio.NewReader(pr).ReadString('\n'); line != "started\n" {
				t.Fatalf("read %q, %v\nstderr: %s", line, err, &stderr)
			}
			if err := cmd.Process.Signal(tt.sig); err != nil {
				t.Fatal(err)
			}
			// Grace (2 s) plus the report slack (5 s) is the bound by design; this one only catches a hang.
			const bound = 45 * time.Second
			start := time.Now()
			select {
			case <-exited:
			case <-time.After(bound):
				t.Fatalf("sandkeep did not exit within %v of %v", bound, tt.sig)
			}
			t.Logf("sandkeep exited %v after %v", tt.sig, time.Since(start).Round(time.Millisecond))
			if got := cmd.ProcessState.ExitCode(); got != tt.code {
				t.Errorf("exit %d, want %d\nstderr: %s", got, tt.code, &stderr)
			}
			if !strings.Contains(stderr.String(), "interrupted") {
				t.Errorf("stderr does not say sandkeep was interrupted: %q", &stderr)
			}
			r := c.run(t, "exec", "--tenant", c.ten("default"), "--user", user, "--", "ps", "-o", "pid,args").want(t, 0)
			if strings.Contains(r.stdout, "sleep") {
				t.Errorf("the command's processes outlived the interrupt:\n%s", r.stdout)
			}
		})
	}
}

// TestExecClosedPipe: when sandkeep's stdout reader goes away (`sandkeep exec ... | head -1`), the command is
// stopped, its tree killed, and sandkeep exits 141 as a process killed by SIGPIPE would, without dying of it.
func TestExecClosedPipe(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), processBound)
	defer cancel()
	tenant := c.ten("default")
	cmd := c.command(ctx, nil, "exec", "--tenant", tenant, "--user", "pipe", "--", "sh", "-c", "echo started; exec yes")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = pw, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if line, err := bufio.NewReader(pr).ReadString('\n'); line != "started\n" {
		t.Fatalf("read %q, %v\nstderr: %s", line, err, &stderr)
	}
	pr.Close()
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !ee.Exited() || ee.ExitCode() != 141 {
		t.Fatalf("sandkeep ended with %v, want exit status 141\nstderr: %s", err, &stderr)
	}
	r := c.run(t, "exec", "--tenant", tenant, "--user", "pipe", "--", "ps", "-o", "pid,args").want(t, 0)
	if strings.Contains(r.stdout, "yes") {
		t.Errorf("the command outlived its reader:\n%s", r.stdout)
	}
}
