package main

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
	"unsafe"
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

// rlimitRSS is RLIMIT_RSS from <asm-generic/resource.h>. Linux has ignored it since 2.6 and gVisor enforces it
// nowhere either, so its hard limit can carry a supervisor's mark (see tree).
const rlimitRSS = 5

// markBase is the lowest mark: a supervisor's mark is markBase plus its pid, far above any RSS a limit could mean
// and below the RLIM_INFINITY every other process of the sandbox inherits.
const markBase = 1 << 50

// markOf is the mark of the supervisor with pid.
func markOf(pid int) uint64 { return markBase + uint64(pid) }

// marked reports whether m is a mark (of some supervisor, live or not).
func marked(m uint64) bool { return m >= markBase && m-markBase <= 1<<32 }

// prlimit is prlimit64(2): pid's limit of res, set to set when set is not nil, and the old one into old when old
// is not nil.
func prlimit(pid, res int, set, old *syscall.Rlimit) error {
	_, _, errno := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), uintptr(res),
		uintptr(unsafe.Pointer(set)), uintptr(unsafe.Pointer(old)), 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// setMark lowers this process's RLIMIT_RSS to mark, soft and hard. Its children inherit it through fork, exec and
// setsid, and without CAP_SYS_RESOURCE (no sandbox process has it) none can raise it again.
func setMark(mark uint64) error {
	return prlimit(0, rlimitRSS, &syscall.Rlimit{Cur: mark, Max: mark}, nil)
}

// markOfProc reads pid's mark: its RLIMIT_RSS hard limit. ok is false when pid is gone or not readable.
func markOfProc(pid int) (mark uint64, ok bool) {
	var r syscall.Rlimit
	if prlimit(pid, rlimitRSS, nil, &r) != nil {
		return 0, false
	}
	return r.Max, true
}

// tree is the set of processes a command of this agent may have left: its descendants through the ppid links
// in /proc, and, when the agent could not become a subreaper (adopted), the orphans PID 1 adopted since the agent
// started and their descendants.
//
// gVisor's Sentry (runsc 20221219) answers PR_SET_CHILD_SUBREAPER with EINVAL, so there a command's setsid,
// nohup or double-forked child reparents to PID 1 as soon as its parent exits, and wait4 in the agent no longer
// sees it. An orphan of PID 1 that started no earlier than this agent is one of this sandbox's commands': the
// processes the engine execs (the agent itself, its put-file, rm-file and dial, a relay) have no parent in the
// namespace (ppid 0), and PID 1 forks nothing but a session's serve. Whose it is, with several commands at once
// (an agent the engine execs for one command beside a session's supervisors, supervisor_linux.go), the mark
// tells: every supervisor lowers its RLIMIT_RSS hard limit to a value of its own (markOf its pid) before its
// command starts, every descendant inherits it through fork, exec and setsid, and no sandbox process can raise
// it. So a supervisor's tree takes the orphans that carry its mark, and any other agent's tree the orphans that
// carry no mark. A process that lowers its own RLIMIT_RSS to another supervisor's mark is taken for that one's
// and dies with it instead; below every mark, it is taken for an unmarked one's; and the session's serve, as it
// ends, kills every orphan of the session whatever its mark (server.end), so none outlives the session.
type tree struct {
	self    int
	adopted bool   // no subreaper: orphans reparent to PID 1
	start   uint64 // the agent's start time (clock ticks since boot, /proc/self/stat field 22)
	r       *reaper
	sup     *supervisors // children that supervise concurrent commands and processes: not part of the tree
	// Adopted only: mark is set for a supervisor (an agent whose parent is another agent), whose tree takes
	// only the orphans with its mark; markErr says why it could not be set (the supervisor then refuses its
	// command: its tree could not be told from the others'). anyMark makes the tree take every orphan of the
	// session, marked or not (a session's last kill).
	mark    uint64
	markErr error
	anyMark bool
}

// newTree is the tree of this process; subreaper says whether setSubreaper succeeded.
func newTree(subreaper bool, r *reaper, sup *supervisors) tree {
	t := tree{self: os.Getpid(), adopted: !subreaper, r: r, sup: sup}
	if t.adopted {
		if st, ok := readStat(t.self); ok {
			t.start = st.start
		}
		if os.Getppid() > 1 { // a supervisor: the session's serve is a child of PID 1 or of the engine's exec (0)
			t.mark = markOf(t.self)
			t.markErr = setMark(t.mark)
		}
	}
	return t
}

// claims reports whether the orphan pid (of PID 1, started during this session) belongs to this tree.
func (t tree) claims(pid int) bool {
	if t.anyMark {
		return true
	}
	m, ok := markOfProc(pid)
	if t.mark != 0 {
		return ok && m == t.mark
	}
	return !ok || !marked(m)
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
		if t.adopted && st.ppid == 1 && st.start >= t.start && t.claims(pid) {
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
// at all (wait4 found none) and a subreaper, nothing of the tree can be alive (orphans reparent to the agent).
// Without one, or while supervisors run (the agent then always has children), the tree is gone when /proc shows
// no live member.
func (t tree) quiet() (bool, <-chan struct{}) {
	idle, changed := t.r.state()
	switch {
	case idle && !t.adopted:
		return true, changed
	case idle || t.adopted || t.sup.count() > 0:
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
