package main

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

// reapSettle is how long killTree lets the reaper prove that no descendant is left before it walks /proc.
const reapSettle = 2 * time.Millisecond

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from <linux/prctl.h>.
const prSetChildSubreaper = 36

// setSubreaper makes orphaned descendants reparent to this process instead of PID 1, so that a command's
// double-forked, setsid or nohup children stay in the tree the agent kills and reaps.
func setSubreaper() error {
	_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// descendants returns the live (not zombie) processes below pid, found through the ppid links in /proc. Because
// the agent is a subreaper, every process a command left behind is still linked to it.
func descendants(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := make(map[int][]int)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, live := readStat(pid); live {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// readStat returns the parent of pid and whether it is alive (neither a zombie nor dead).
func readStat(pid int) (ppid int, live bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	return parseStat(b)
}

// parseStat reads the state and ppid fields of /proc/<pid>/stat. The command name (field 2) may hold spaces
// and parentheses, so fields are counted from the last ')'.
func parseStat(b []byte) (ppid int, live bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(string(f[1]))
	if err != nil {
		return 0, false
	}
	state := f[0]
	return ppid, !(len(state) == 1 && (state[0] == 'Z' || state[0] == 'X'))
}

// signalTree sends sig to every live descendant of the agent and reports how many it found.
func signalTree(sig syscall.Signal) int {
	pids := descendants(os.Getpid())
	for _, p := range pids {
		_ = syscall.Kill(p, sig) // ESRCH: it just exited, which is what we want
	}
	return len(pids)
}

// killTree ends every descendant of the agent: SIGTERM (and SIGCONT, so stopped processes see it), up to grace
// for them to exit, then SIGKILL until none is left. It returns when reaped is closed, that is when the agent
// has no child left: wait4 then found nothing, so no descendant exists (orphans reparent to the agent).
func killTree(grace time.Duration, reaped <-chan struct{}) {
	// Most commands leave nothing behind: the reaper then finds no child right after the foreground one, which
	// proves there is no descendant, and the /proc walk (its cost grows with every process visible) is skipped.
	settle := time.NewTimer(reapSettle)
	select {
	case <-reaped:
		settle.Stop()
		return
	case <-settle.C:
	}
	if signalTree(syscall.SIGTERM) > 0 {
		signalTree(syscall.SIGCONT)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-reaped:
		return
	case <-t.C:
	}
	// Repeat: a process may fork between the scan and the kill.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		signalTree(syscall.SIGKILL)
		select {
		case <-reaped:
			return
		case <-tick.C:
		}
	}
}

// reap collects every child of the agent until none is left, passes on the foreground command's status, and
// closes reaped. It is the only place the agent waits for processes.
func reap(fg int, fgStatus chan<- syscall.WaitStatus, reaped chan<- struct{}) {
	defer close(reaped)
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil { // ECHILD: no child, hence no descendant, is left
			return
		}
		if pid == fg {
			fgStatus <- ws // buffered: the foreground exits once
		}
	}
}
