//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// dialHelperEnv makes the test binary, started as a command inside a sandbox, dial the socket it names and exit:
// a process other than PID 1 connecting to the channel (see TestChannelOtherPeer and TestMain).
const dialHelperEnv = "SANDKEEP_AGENT_TEST_DIAL"

// runDialHelper is the test binary's job when dialHelperEnv is set.
func runDialHelper(path string) int {
	c, err := net.Dial("unix", path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("connected")
	c.Close()
	return 0
}

// channelHost plays sandkeep's side of the channel: a Unix listener in a directory the sandbox sees read-only.
type channelHost struct {
	dir, path string
	ln        *net.UnixListener // nil until listen
}

// newChannelHost makes the socket's directory (short: a sockaddr_un holds 107 bytes) without listening yet.
func newChannelHost(t *testing.T) *channelHost {
	t.Helper()
	dir, err := os.MkdirTemp("", "skchan")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return &channelHost{dir: dir, path: filepath.Join(dir, "a.sock")}
}

func (h *channelHost) listen(t *testing.T) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: h.path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	h.ln = ln
	t.Cleanup(func() { ln.Close() })
}

// hostConn is one accepted connection and the pid (as the test sees it) of the process that connected.
type hostConn struct {
	*net.UnixConn
	peerPID int
	nextID  uint32
}

// accept waits at most d for the next connection and reads its SO_PEERCRED.
func (h *channelHost) accept(t *testing.T, d time.Duration) *hostConn {
	t.Helper()
	c, err := h.tryAccept(d)
	if err != nil {
		t.Fatalf("accept within %v: %v", d, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (h *channelHost) tryAccept(d time.Duration) (*hostConn, error) {
	if err := h.ln.SetDeadline(time.Now().Add(d)); err != nil {
		return nil, err
	}
	conn, err := h.ln.AcceptUnix()
	if err != nil {
		return nil, err
	}
	pid, err := peerPID(conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &hostConn{UnixConn: conn, peerPID: pid}, nil
}

// peerPID is the pid of the process that called connect(2) on the other end, in the caller's PID namespace.
func peerPID(conn *net.UnixConn) (int, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, credErr
	}
	return int(cred.Pid), nil
}

func (c *hostConn) request(argv ...string) agentproto.Request {
	c.nextID++
	return agentproto.Request{
		Version: agentproto.Version, ID: c.nextID, Argv: argv, TimeoutMS: 30_000, GraceMS: 500,
		StdoutLimit: agentproto.DefaultLimit, StderrLimit: agentproto.DefaultLimit,
	}
}

func (c *hostConn) run(t *testing.T, req agentproto.Request, stdin io.Reader) outcome {
	t.Helper()
	var out, errb strings.Builder
	res, err := agentproto.Run(t.Context(), c, req, &out, &errb, stdin)
	return outcome{res, err, out.String(), errb.String()}
}

// sandbox is `sandkeep-agent init --channel` as PID 1 of a new PID namespace (with its own /proc, and the
// socket's directory bind-mounted read-only over itself, as in a container), started through unshare.
type sandbox struct {
	cmd  *exec.Cmd
	init int // the agent's pid as the test sees it
	done chan error
}

func startSandbox(t *testing.T, h *channelHost) *sandbox {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the channel tests need root to create PID and mount namespaces")
	}
	cmd := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c",
		`mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && exec "$0" init --channel "$2"`,
		agentBin, h.dir, h.path)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sb := &sandbox{cmd: cmd, done: make(chan error, 1)}
	go func() { sb.done <- cmd.Wait() }()
	t.Cleanup(func() { sb.stop(t) })
	deadline := time.Now().Add(10 * time.Second)
	for sb.init == 0 && time.Now().Before(deadline) {
		for _, pid := range childrenOf(cmd.Process.Pid) {
			if exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); exe == agentBin {
				sb.init = pid
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if sb.init == 0 {
		t.Fatal("agent init did not start")
	}
	return sb
}

// stop ends init the way the engine does, with SIGKILL (init ignores every other signal).
func (sb *sandbox) stop(t *testing.T) {
	_ = syscall.Kill(sb.init, syscall.SIGKILL)
	select {
	case <-sb.done: // unshare reports its child's SIGKILL
	case <-time.After(10 * time.Second):
		sb.cmd.Process.Kill() // --kill-child: init goes too
		<-sb.done
		t.Error("init did not end on SIGKILL")
	}
}

// hostPID maps a pid inside the sandbox's PID namespace to the test's view, while that process lives.
func (sb *sandbox) hostPID(inner int) (int, error) {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", sb.init))
	if err != nil {
		return 0, err
	}
	matches, _ := filepath.Glob("/proc/[0-9]*/status")
	for _, m := range matches {
		dir := filepath.Dir(m)
		if other, _ := os.Readlink(dir + "/ns/pid"); other != ns {
			continue
		}
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			f := strings.Fields(line)
			if len(f) >= 3 && f[0] == "NSpid:" && f[len(f)-1] == strconv.Itoa(inner) {
				return strconv.Atoi(f[1])
			}
		}
	}
	return 0, fmt.Errorf("no process %d in the sandbox", inner)
}

// vmRSS is the resident set of pid in KiB.
func vmRSS(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kib, _ := strconv.Atoi(f[1])
			return kib
		}
	}
	t.Fatalf("no VmRSS for %d", pid)
	return 0
}

// serveChild is init's serve child, once it is there.
func (sb *sandbox) serveChild(t *testing.T) int {
	t.Helper()
	for range 500 {
		for _, pid := range childrenOf(sb.init) {
			if st, ok := readStat(pid); ok && st.live {
				return pid
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("init has no serve child")
	return 0
}

// TestChannelServes: init dials the host as PID 1 and serves commands, one after another, on that connection.
func TestChannelServes(t *testing.T) {
	t.Parallel()
	h := newChannelHost(t)
	h.listen(t)
	sb := startSandbox(t, h)
	c := h.accept(t, 10*time.Second)
	if c.peerPID != sb.init {
		t.Fatalf("peer pid %d, want init's %d", c.peerPID, sb.init)
	}

	tests := []struct {
		name         string
		argv         []string
		code, signal int
		stdout       string
		stderr       string
	}{
		{"exit 0", []string{"true"}, 0, 0, "", ""},
		{"exit 1", []string{"false"}, 1, 0, "", ""},
		{"exit 23 with output", sh("echo out; echo err >&2; exit 23"), 23, 0, "out\n", "err\n"},
		{"PID 1 is init", sh("cat /proc/1/cmdline | tr '\\0' ' '"), 0, 0, agentBin + " init --channel " + h.path + " ", ""},
		{"killed", sh("kill -TERM $$"), 143, 15, "", ""},
		{"not found", []string{"sandkeep-no-such-command"}, 127, 0, "", "sandkeep-agent: sandkeep-no-such-command: command not found\n"},
	}
	for _, tt := range tests {
		got := c.run(t, c.request(tt.argv...), nil)
		if got.err != nil || got.res.ExitCode != tt.code || got.res.Signal != tt.signal || got.stdout != tt.stdout || got.stderr != tt.stderr {
			t.Errorf("%s: got %+v", tt.name, got)
		}
	}

	if got := c.run(t, c.request("sh", "-c", "touch \"$1\"/x 2>/dev/null", "sh", h.dir), nil); got.err != nil || got.res.ExitCode == 0 {
		t.Errorf("the socket's directory is writable inside: %+v", got)
	}

	req := c.request("cat")
	req.Stdin = true
	if got := c.run(t, req, strings.NewReader("to stdin\n")); got.err != nil || got.stdout != "to stdin\n" {
		t.Errorf("stdin: got %+v", got)
	}

	const marker = 999201
	req = c.request("sh", "-c", fmt.Sprintf("setsid sleep %d & sleep %d & echo started; wait", marker, marker))
	req.TimeoutMS, req.GraceMS = 500, 200
	if got := c.run(t, req, nil); got.err != nil || !got.res.TimedOut || got.res.ExitCode != 143 || got.stdout != "started\n" {
		t.Errorf("timeout: got %+v", got)
	}
	checkGone(t, nil, marker)

	serve := sb.serveChild(t)
	for _, pid := range []int{sb.init, serve} {
		kib := vmRSS(t, pid)
		t.Logf("pid %d: VmRSS %d KiB", pid, kib)
		if kib > 8<<10 {
			t.Errorf("pid %d: VmRSS %d KiB, over 8 MiB", pid, kib)
		}
	}
	if got := c.run(t, c.request("true"), nil); got.err != nil || got.res.ExitCode != 0 {
		t.Errorf("last command: %+v", got)
	}
}

// TestChannelHostLate: init starts before the host listens and connects once it does.
func TestChannelHostLate(t *testing.T) {
	t.Parallel()
	h := newChannelHost(t)
	sb := startSandbox(t, h)
	time.Sleep(300 * time.Millisecond)
	h.listen(t)
	start := time.Now()
	c := h.accept(t, 10*time.Second)
	t.Logf("connected %v after the listen", time.Since(start))
	if c.peerPID != sb.init {
		t.Fatalf("peer pid %d, want init's %d", c.peerPID, sb.init)
	}
	if got := c.run(t, c.request("true"), nil); got.err != nil || got.res.ExitCode != 0 {
		t.Fatalf("got %+v", got)
	}
}

// TestChannelServeKilled: a command kills the serve child. The host's command fails with ErrProtocol; init kills
// everything the session left (here a setsid sleep) before it reconnects, and the new connection serves.
func TestChannelServeKilled(t *testing.T) {
	t.Parallel()
	h := newChannelHost(t)
	h.listen(t)
	sb := startSandbox(t, h)
	c := h.accept(t, 10*time.Second)

	const marker = 999202
	req := c.request("sh", "-c", fmt.Sprintf("setsid sleep %d & echo $!; read go; kill -9 $PPID; sleep %d", marker, marker))
	req.Stdin = true
	out := newSignalWriter("\n")
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	var sleeper int
	var sleeperErr error
	found := make(chan struct{})
	go func() { // find the sleep's pid from the outside while it surely lives, then let the command go on
		defer close(found)
		select {
		case <-out.seen:
			inner, err := strconv.Atoi(strings.TrimSpace(out.String()))
			if err != nil {
				sleeperErr = fmt.Errorf("first line %q: %w", out.String(), err)
			} else {
				sleeper, sleeperErr = sb.hostPID(inner)
			}
		case <-time.After(10 * time.Second):
			sleeperErr = errors.New("no pid printed")
		}
		io.WriteString(stdinW, "go\n")
	}()
	_, err := agentproto.Run(t.Context(), c, req, out, nil, stdinR)
	<-found
	if sleeperErr != nil {
		t.Fatalf("sleep pid: %v", sleeperErr)
	}
	if !errors.Is(err, agentproto.ErrProtocol) {
		t.Fatalf("err = %v, want ErrProtocol", err)
	}
	start := time.Now()
	c2 := h.accept(t, 10*time.Second)
	t.Logf("reconnected %v after the host saw the stream end", time.Since(start))
	if err := syscall.Kill(sleeper, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the session's sleep (pid %d) is still there at the reconnect: %v", sleeper, err)
	}
	checkGone(t, nil, marker)
	if c2.peerPID != sb.init {
		t.Fatalf("peer pid %d, want init's %d", c2.peerPID, sb.init)
	}
	if got := c2.run(t, c2.request("sh", "-c", "echo again"), nil); got.err != nil || got.stdout != "again\n" {
		t.Fatalf("after the reconnect: %+v", got)
	}
}

// TestChannelHostClosesIdle: the host hangs up between commands (or right away); init dials again.
func TestChannelHostClosesIdle(t *testing.T) {
	t.Parallel()
	h := newChannelHost(t)
	h.listen(t)
	sb := startSandbox(t, h)
	c := h.accept(t, 10*time.Second)
	if got := c.run(t, c.request("sh", "-c", "echo one"), nil); got.err != nil || got.stdout != "one\n" {
		t.Fatalf("got %+v", got)
	}
	c.Close()
	c = h.accept(t, 10*time.Second)
	c.Close() // hung up before any command: a short session, redialled after the backoff
	c = h.accept(t, 10*time.Second)
	if c.peerPID != sb.init {
		t.Fatalf("peer pid %d, want init's %d", c.peerPID, sb.init)
	}
	if got := c.run(t, c.request("sh", "-c", "echo two"), nil); got.err != nil || got.stdout != "two\n" {
		t.Fatalf("got %+v", got)
	}
}

// TestChannelHostClosesMidCommand: the host hangs up while a command runs; serve kills the tree and exits, and
// init dials again only once the command's processes are gone.
func TestChannelHostClosesMidCommand(t *testing.T) {
	t.Parallel()
	h := newChannelHost(t)
	h.listen(t)
	sb := startSandbox(t, h)
	c := h.accept(t, 10*time.Second)
	const marker = 999203
	req := c.request("sh", "-c", fmt.Sprintf("sleep %d & setsid sleep %d & echo started; wait", marker, marker))
	body, _ := json.Marshal(req)
	if err := agentproto.WriteFrame(c, agentproto.FrameRequest, req.ID, body); err != nil {
		t.Fatal(err)
	}
	var buf []byte
	if f, err := agentproto.ReadFrame(c, &buf); err != nil || f.Type != agentproto.FrameAccepted {
		t.Fatalf("first frame %+v, %v; want the accept", f, err)
	}
	if f, err := agentproto.ReadFrame(c, &buf); err != nil || f.Type != agentproto.FrameStdout {
		t.Fatalf("second frame %+v, %v", f, err)
	}
	c.Close()
	c = h.accept(t, 10*time.Second)
	checkGone(t, nil, marker)
	if c.peerPID != sb.init {
		t.Fatalf("peer pid %d, want init's %d", c.peerPID, sb.init)
	}
	if got := c.run(t, c.request("true"), nil); got.err != nil || got.res.ExitCode != 0 {
		t.Fatalf("got %+v", got)
	}
}

// TestChannelOtherPeer: any process that sees the socket can connect to it, not only init. Telling them apart is
// the host's job: the peer pid of such a connection is not init's.
func TestChannelOtherPeer(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h := newChannelHost(t)
	h.listen(t)
	sb := startSandbox(t, h)
	c := h.accept(t, 10*time.Second)
	req := c.request(self)
	req.Env = []string{dialHelperEnv + "=" + h.path}
	got := make(chan outcome, 1)
	go func() {
		var out, errb strings.Builder
		res, err := agentproto.Run(t.Context(), c, req, &out, &errb, nil)
		got <- outcome{res, err, out.String(), errb.String()}
	}()
	other := h.accept(t, 10*time.Second)
	if g := <-got; g.err != nil || g.res.ExitCode != 0 || g.stdout != "connected\n" {
		t.Fatalf("dial helper: %+v", g)
	}
	if other.peerPID == sb.init || other.peerPID <= 0 {
		t.Fatalf("a command's connection has peer pid %d (init is %d)", other.peerPID, sb.init)
	}
	t.Logf("init %d, the command's connection %d", sb.init, other.peerPID)
}

// TestChannelSignalsToPID1: whatever a command sends to PID 1 changes nothing.
func TestChannelSignalsToPID1(t *testing.T) {
	t.Parallel()
	h := newChannelHost(t)
	h.listen(t)
	sb := startSandbox(t, h)
	c := h.accept(t, 10*time.Second)
	got := c.run(t, c.request("sh", "-c", "for s in TERM INT HUP QUIT USR1 USR2 PIPE ALRM ABRT SEGV CHLD KILL STOP; do kill -$s 1; done; sleep 0.2; echo ok"), nil)
	if got.err != nil || got.res.ExitCode != 0 || got.stdout != "ok\n" {
		t.Fatalf("got %+v", got)
	}
	if got := c.run(t, c.request("true"), nil); got.err != nil || got.res.ExitCode != 0 {
		t.Fatalf("after the signals: %+v", got)
	}
	if s := statOf(sb.init); strings.Contains(s, ") T ") || s == "" {
		t.Fatalf("init stopped or gone: %q", s)
	}
}

// TestChannelIdle: with no host listening, init retries with a backoff that stays cheap, and stays small.
func TestChannelIdle(t *testing.T) {
	t.Parallel()
	h := newChannelHost(t)
	sb := startSandbox(t, h)
	time.Sleep(300 * time.Millisecond) // past the first, fast, attempts
	before := cpuTicks(t, sb.init)
	time.Sleep(2 * time.Second)
	used := cpuTicks(t, sb.init) - before
	t.Logf("idle init: %d ticks of CPU in 2 s, VmRSS %d KiB", used, vmRSS(t, sb.init))
	if used >= 10 { // 5% of a CPU over 2 s, in 10 ms ticks
		t.Errorf("idle init used %d ticks of CPU in 2 s", used)
	}
	if kib := vmRSS(t, sb.init); kib > 8<<10 {
		t.Errorf("idle init: VmRSS %d KiB, over 8 MiB", kib)
	}
	if kids := childrenOf(sb.init); len(kids) != 0 {
		t.Errorf("init has children %v without a connection", kids)
	}
}

// TestChannelNeedsPID1: outside PID 1 the channel's kill(-1) would hit the whole machine, so init refuses.
func TestChannelNeedsPID1(t *testing.T) {
	cmd := exec.Command(agentBin, "init", "--channel", "/nonexistent/sandkeep/a.sock")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "PID 1") {
		t.Fatalf("got %v, %q", err, out)
	}
}

func TestParseInitArgs(t *testing.T) {
	long := "/" + strings.Repeat("x", maxSocketPath)
	tests := []struct {
		name    string
		args    []string
		channel string
		egress  string
		bad     bool
	}{
		{name: "none", args: nil},
		{name: "separate", args: []string{"--channel", "/.sandkeep-chan/a.sock"}, channel: "/.sandkeep-chan/a.sock"},
		{name: "equals", args: []string{"--channel=/c/a.sock"}, channel: "/c/a.sock"},
		{name: "one dash", args: []string{"-channel", "/c/a.sock"}, channel: "/c/a.sock"},
		{name: "longest", args: []string{"--channel", long[:maxSocketPath]}, channel: long[:maxSocketPath]},
		{name: "too long", args: []string{"--channel", long}, bad: true},
		{name: "missing value", args: []string{"--channel"}, bad: true},
		{name: "empty", args: []string{"--channel="}, bad: true},
		{name: "relative", args: []string{"--channel", "a.sock"}, bad: true},
		{name: "extra argument", args: []string{"--channel", "/a.sock", "x"}, bad: true},
		{name: "unknown flag", args: []string{"--chanel", "/a.sock"}, bad: true},
		{name: "egress", args: []string{"--channel", "/c/a.sock", "--egress", "127.0.0.1:3128"}, channel: "/c/a.sock", egress: "127.0.0.1:3128"},
		{name: "egress v6", args: []string{"--channel", "/c/a.sock", "--egress=[::1]:3128"}, channel: "/c/a.sock", egress: "[::1]:3128"},
		{name: "egress without channel", args: []string{"--egress", "127.0.0.1:3128"}, bad: true},
		{name: "egress not loopback", args: []string{"--channel", "/c/a.sock", "--egress", "0.0.0.0:3128"}, bad: true},
		{name: "egress no port", args: []string{"--channel", "/c/a.sock", "--egress", "127.0.0.1"}, bad: true},
		{name: "relay alone", args: []string{"--relay"}},
		{name: "relay with channel", args: []string{"--channel", "/c/a.sock", "--relay"}, channel: "/c/a.sock"},
		{name: "relay with a value", args: []string{"--relay=maybe"}, bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, egress, err := parseInitArgs(tt.args)
			if (err != nil) != tt.bad || (!tt.bad && (got != tt.channel || egress != tt.egress)) {
				t.Fatalf("got %q %q, %v", got, egress, err)
			}
		})
	}
}

// TestChannelCleanEndSparesOthers: when the host hangs up while serve is idle (a short-lived CLI process exits),
// serve exits 0 and init dials again without sweeping the namespace: a process that another host process
// started in the sandbox meanwhile (through the engine's exec, under the sandbox's gate) must survive.
func TestChannelCleanEndSparesOthers(t *testing.T) {
	t.Parallel()
	h := newChannelHost(t)
	h.listen(t)
	sb := startSandbox(t, h)
	c := h.accept(t, 10*time.Second)
	if got := c.run(t, c.request("true"), nil); got.err != nil {
		t.Fatalf("got %+v", got)
	}
	// A process in the sandbox's PID namespace that is not a child of serve, as a Docker exec would be.
	other := exec.Command("nsenter", "-t", strconv.Itoa(sb.init), "-p", "--", "sleep", "999404")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed (not sent on) when the process is reaped, so both the check below and the cleanup can
	// wait on it: a value channel read by a failing check would leave the cleanup waiting forever.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = other.Wait(); close(exited) }()
	t.Cleanup(func() { other.Process.Kill(); <-exited })
	time.Sleep(100 * time.Millisecond) // let it enter the namespace
	c.Close()
	c = h.accept(t, 10*time.Second)
	if c.peerPID != sb.init {
		t.Fatalf("peer pid %d, want init's %d", c.peerPID, sb.init)
	}
	time.Sleep(100 * time.Millisecond) // a sweep, if there were one, would have run before the dial
	select {
	case <-exited:
		t.Fatalf("a process outside the session was killed by a clean hang-up: %v", waitErr)
	default:
	}
}
