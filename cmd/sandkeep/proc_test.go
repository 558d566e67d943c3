package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestProcCLI: `sandkeep exec --detach` prints the pid of a process that runs on after it returns, beside the
// user's commands; `proc ls`, `proc logs`, `proc kill` (by tag, with -s, and whole) list, read and end it. The
// calls go through the home's daemon, which holds the channels; in-process (SANDKEEP_DAEMON=off) and where the
// sandbox has no channel the start is PROCESS_UNAVAILABLE.
func TestProcCLI(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	who := []string{"--tenant", c.ten("acme"), "--user", "alice"}
	start := append(append([]string{"exec", "--detach", "--tag", "dev", "--lifetime", "10m"}, who...),
		"--", "sh", "-c", "echo ready; trap 'echo hup' HUP; while true; do sleep 1; done")
	if !c.processesServed() || os.Getenv("SANDKEEP_TEST_DAEMON") == "" || os.Getenv("SANDKEEP_TEST_DAEMON") == "off" {
		c.run(t, start...).wantFailure(t, "PROCESS_UNAVAILABLE")
		return
	}
	pid := strings.TrimSpace(c.run(t, start...).want(t, 0).stdout)
	if !regexp.MustCompile(`^[0-9]+$`).MatchString(pid) {
		t.Fatalf("exec --detach printed %q, want a pid", pid)
	}
	if out := c.run(t, append(append([]string{"exec"}, who...), "--", "echo", "beside")...).want(t, 0).stdout; out != "beside\n" {
		t.Fatalf("a command beside the process: %q", out)
	}
	ls := c.run(t, append([]string{"proc", "ls"}, who...)...).want(t, 0).stdout
	if !regexp.MustCompile(`(?m)^` + pid + `\s+dev\s+running\s`).MatchString(ls) {
		t.Fatalf("proc ls:\n%s", ls)
	}
	c.run(t, append(append([]string{"proc", "kill", "-s", "HUP"}, who...), "dev")...).want(t, 0)
	deadline := time.Now().Add(30 * time.Second)
	logs := ""
	for time.Now().Before(deadline) {
		logs = c.run(t, append(append([]string{"proc", "logs"}, who...), pid)...).want(t, 0).stdout
		if logs == "ready\nhup\n" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if logs != "ready\nhup\n" {
		t.Fatalf("proc logs: %q", logs)
	}
	c.run(t, append(append([]string{"proc", "kill"}, who...), pid)...).want(t, 0)
	ls = c.run(t, append([]string{"proc", "ls"}, who...)...).want(t, 0).stdout
	if !regexp.MustCompile(`(?m)^` + pid + `\s+dev\s+killed \(\d+\)\s`).MatchString(ls) {
		t.Fatalf("proc ls after the kill:\n%s", ls)
	}
	c.run(t, append(append([]string{"proc", "kill"}, who...), "nope")...).wantFailure(t, "PROCESS_NOT_FOUND")

	// Input: a process started with its stdin open reads what `proc attach -i` sends, until the attach's EOF
	// closes it; the attach follows its output (with --replay, from its first byte) to its end and exit code.
	echo := append(append([]string{"exec", "--detach", "-i", "--tag", "echo", "--lifetime", "10m"}, who...),
		"--", "sh", "-c", "echo ready; while read l; do echo got $l; done; echo closed; exit 3")
	c.run(t, echo...).want(t, 0)
	att := c.runWith(t, strings.NewReader("one\ntwo\n"), nil, append(append([]string{"proc", "attach", "-i", "--replay"}, who...), "echo")...)
	if att.want(t, 3); att.stdout != "ready\ngot one\ngot two\nclosed\n" {
		t.Fatalf("proc attach -i: %q", att.stdout)
	}
	c.run(t, append(append([]string{"exec", "--tag", "x"}, who...), "--", "true")...).wantFailure(t, "INVALID_ARGUMENT")
}
