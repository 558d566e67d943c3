//go:build linux

package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInit runs the agent as PID 1 of a new PID namespace (unshare needs root, which the test hosts have):
// orphans of the namespace reparent to it and must be reaped, it must not spin while idle, a SIGTERM must
// not end it (the only SIGTERM a sandbox's init can receive comes from its own commands), and SIGKILL ends it.
func TestInit(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("TestInit needs root to create a PID namespace")
	}
	// sh is PID 1 first: it leaves an orphan that exits later and a zombie child, then becomes the agent.
	cmd := exec.Command("unshare", "--pid", "--fork", "--kill-child", "sh", "-c",
		`(sleep 0.3 &); sh -c 'exit 0' & sleep 0.1; exec "$0" init`, agentBin)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var agent int
	deadline := time.Now().Add(10 * time.Second)
	for agent == 0 && time.Now().Before(deadline) {
		for _, pid := range childrenOf(cmd.Process.Pid) {
			if exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); exe == agentBin {
				agent = pid
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if agent == 0 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("agent init did not start")
	}
	cpuBefore := cpuTicks(t, agent)
	time.Sleep(time.Second) // the orphan exits meanwhile
	for _, pid := range childrenOf(agent) {
		t.Errorf("child %d of init not reaped (stat %q)", pid, statOf(pid))
	}
	if used := cpuTicks(t, agent) - cpuBefore; used > 20 { // 0.2 s of CPU in 1 s: it would be spinning
		t.Errorf("idle init used %d ticks of CPU in a second", used)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1} {
		if err := syscall.Kill(agent, sig); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("init ended on a signal it must ignore: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := syscall.Kill(agent, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done: // unshare reports its child's SIGKILL
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("init did not end on SIGKILL")
	}
}

// childrenOf lists the processes whose parent is pid, zombies included.
func childrenOf(pid int) []int {
	var out []int
	matches, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(m)))
			out = append(out, child)
		}
	}
	return out
}

func statOf(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return string(b)
}

// cpuTicks is utime+stime of pid, in clock ticks.
func cpuTicks(t *testing.T, pid int) int {
	s := statOf(pid)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		t.Fatalf("stat of %d: %q", pid, s)
	}
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return utime + stime
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		name  string
		stat  string
		ppid  int
		live  bool
		start uint64
	}{
		{"plain", "42 (sleep) S 7 42 42 0", 7, true, 0},
		{"spaces and parens in name", "42 (a) b (c) R 9 1 1", 9, true, 0},
		{"zombie", "42 (sh) Z 7 42 42", 7, false, 0},
		{"dead", "42 (sh) X 7", 7, false, 0},
		{"garbage", "nonsense", 0, false, 0},
		{"start time", "42 (sle ep) S 1 42 42 0 -1 4194304 90 0 0 0 0 0 0 0 20 0 1 0 12345 10555392 794", 1, true, 12345},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, _ := parseStat([]byte(tt.stat))
			if st.ppid != tt.ppid || st.live != tt.live || st.start != tt.start {
				t.Fatalf("got (%d, %v, %d), want (%d, %v, %d)", st.ppid, st.live, st.start, tt.ppid, tt.live, tt.start)
			}
		})
	}
}

func TestMergeEnv(t *testing.T) {
	got := mergeEnv([]string{"A=1", "PATH=/bin", "B=2"}, []string{"PATH=/x", "C=3", "A=4"})
	want := []string{"A=4", "PATH=/x", "B=2", "C=3"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("got %v, want %v", got, want)
	}
}
