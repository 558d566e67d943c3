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

// adoptedPoll is how often killTree looks again, once the agent has no child left, for adopted orphans that are
// still alive (tree.adopted: no subreaper).
const adoptedPoll = 5 * time.Millisecond

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

// tree is the set of processes a command of this agent may have left: its descendants through the ppid links
// in /proc, and, when the agent could not become a subreaper (adopted), the orphans PID 1 adopted since the agent
// started and their descendants.
//
// gVisor's Sentry (runsc 20221219) answers PR_SET_CHILD_SUBREAPER with EINVAL, so there a command's setsid,
// nohup or double-forked child reparents to PID 1 as soon as its parent exits, and wait4 in the agent no longer
// sees it. Every such process is still one of ours: the host runs one command at a time in a sandbox (the key's
// gate), the processes the engine execs (the agent itself, its put-file, rm-file and dial) have no parent in
// the namespace (ppid 0), and PID 1 forks nothing but the channel's serve, which started before this agent's
// command. So a process whose parent is PID 1 and that started no earlier than this agent is an orphan of one
// of this agent's commands.
type tree struct {
	self    int
	adopted bool   // no subreaper: orphans reparent to PID 1
	start   uint64 // the agent's start time (clock ticks since boot, /proc/self/stat field 22)
	r       *reaper
	sup     *supervisors // children that supervise concurrent commands and processes: not part of the tree
}

// newTree is the tree of this process; subreaper says whether setSubreaper succeeded.
func newTree(subreaper bool, r *reaper, sup *supervisors) tree {
	t := tree{self: os.Getpid(), adopted: !subreaper, r: r, sup: sup}
	if t.adopted {
		if st, ok := readStat(t.self); ok {
			t.start = st.start
		}
	}
	return t
}

// procStat is what the tree needs of /proc/<pid>/stat.
type procStat struct {
	ppid  int
	live  bool   // neither a zombie nor dead
	start uint64 // start time in clock ticks since boot
}

// members returns the live (not zombie) processes of the tree, found through the ppid links in /proc.
func (t tree) members() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := make(map[int][]int)
	queue := []int{t.self}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == t.self {
			continue
		}
		st, ok := readStat(pid)
		if !ok || !st.live {
			continue
		}
		children[st.ppid] = append(children[st.ppid], pid)
		if t.adopted && st.ppid == 1 && st.start >= t.start {
			queue = append(queue, pid) // an orphan of one of our commands (see tree)
		}
	}
	var out []int
	for i := 0; i < len(queue); i++ {
		p := queue[i]
		if i > 0 {
			out = append(out, p)
		}
		for _, c := range children[p] {
			if p == t.self && t.sup.has(c) {
				continue // a supervisor and its subtree belong to its own command
			}
			queue = append(queue, c)
		}
	}
	return out
}

// readStat reads pid's /proc/<pid>/stat; ok is false when it is gone or unreadable.
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	return parseStat(b)
}

// parseStat reads the state (3), ppid (4) and starttime (22) fields of /proc/<pid>/stat. The command name
// (field 2) may hold spaces and parentheses, so fields are counted from the last ')'.
func parseStat(b []byte) (st procStat, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 {
		return procStat{}, false
	}
	ppid, err := strconv.Atoi(string(f[1]))
	if err != nil {
		return procStat{}, false
	}
	state := f[0]
	st = procStat{ppid: ppid, live: !(len(state) == 1 && (state[0] == 'Z' || state[0] == 'X'))}
	if len(f) > 19 {
		st.start, _ = strconv.ParseUint(string(f[19]), 10, 64)
	}
	return st, true
}

// signal sends sig to every live process of the tree and reports how many it found.
func (t tree) signal(sig syscall.Signal) int {
	pids := t.members()
	for _, p := range pids {
		_ = syscall.Kill(p, sig) // ESRCH: it just exited, which is what we want
	}
	return len(pids)
}

// quiet reports whether the tree is gone, and a channel closed at the reaper's next change. With no child left
// at all (wait4 found none) and a subreaper, nothing of the tree can be alive (orphans reparent to the agent); without
// one, no adopted orphan may be alive either. While supervisors run, the agent always has children: the tree is
// gone when /proc shows no live member.
func (t tree) quiet() (bool, <-chan struct{}) {
	idle, changed := t.r.state()
	switch {
	case idle:
		return !t.adopted || len(t.members()) == 0, changed
	case !t.adopted && t.sup.count() > 0:
		return len(t.members()) == 0, changed
	}
	return false, changed
}

// wait returns true once the tree is gone, or false when the timer fires first.
func (t tree) wait(timer <-chan time.Time) bool {
	var poll <-chan time.Time
	if t.adopted || t.sup.count() > 0 {
		tick := time.NewTicker(adoptedPoll) // only /proc can tell, so look again now and then
		defer tick.Stop()
		poll = tick.C
	}
	for {
		q, changed := t.quiet()
		if q {
			return true
		}
		select {
		case <-changed:
		case <-poll:
		case <-timer:
			q, _ := t.quiet()
			return q
		}
	}
}

// kill ends every process of the tree: SIGTERM (and SIGCONT, so stopped processes see it), up to grace for
// them to exit, then SIGKILL until none is left. It returns when the tree is gone (tree.quiet).
func (t tree) kill(grace time.Duration) {
	// Most commands leave nothing behind: the reaper then finds no child right after the foreground one, which
	// proves there is no descendant, and the /proc walk (its cost grows with every process visible) is skipped.
	// Without a subreaper, or beside supervisors, the walk is the only proof, so it is always made.
	settle := time.NewTimer(reapSettle)
	if t.wait(settle.C) {
		settle.Stop()
		return
	}
	if t.signal(syscall.SIGTERM) > 0 {
		t.signal(syscall.SIGCONT)
	}
	g := time.NewTimer(grace)
	defer g.Stop()
	if t.wait(g.C) {
		return
	}
	// Repeat: a process may fork between the scan and the kill.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		t.signal(syscall.SIGKILL)
		if t.wait(tick.C) {
			return
		}
	}
}
