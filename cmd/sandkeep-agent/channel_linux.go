package main

import (
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The persistent channel: init (PID 1) dials the host's Unix socket, hands the connection to a `serve` child as
// its stdin and stdout, and dials again once that child is gone and every other process of the sandbox is dead.
// The host accepts a connection only from the container's PID 1 (SO_PEERCRED), so init itself calls connect(2).
const (
	// dialBackoffMin and dialBackoffMax bound the wait between two connect attempts while the host is not
	// listening: an idle sandbox whose host is away makes at most about five attempts a second.
	dialBackoffMin = 2 * time.Millisecond
	dialBackoffMax = 200 * time.Millisecond

	// healthySession is how long a session must last for the next dial to be immediate. A host that accepts and
	// drops the connection at once is dialled again with the backoff, so init never spins.
	healthySession = 100 * time.Millisecond

	// sweepPollMin and sweepPollMax pace the SIGKILL sweep after a session ends, between the SIGCHLDs that
	// drive it; sweepSlow is when a sweep that is still not done gets logged.
	sweepPollMin = 2 * time.Millisecond
	sweepPollMax = 200 * time.Millisecond
	sweepSlow    = 2 * time.Second
)

// maxSocketPath is the longest path a sockaddr_un holds (108 bytes with the terminating NUL).
const maxSocketPath = 107

// checkChannelPath validates the --channel flag: an absolute path that fits in a sockaddr_un.
func checkChannelPath(p string) error {
	switch {
	case p == "":
		return errors.New("--channel: empty path")
	case !filepath.IsAbs(p):
		return fmt.Errorf("--channel %q: not an absolute path", p)
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("--channel %q: contains a NUL byte", p)
	case len(p) > maxSocketPath:
		return fmt.Errorf("--channel: path of %d bytes, longer than the %d a Unix socket address holds", len(p), maxSocketPath)
	}
	return nil
}

// channelState is what init's channel loop is doing.
type channelState int

const (
	dialing  channelState = iota // no session: connect attempts, with backoff
	serving                      // a serve child owns the connection
	sweeping                     // the serve child is gone: killing and reaping everything before dialling again
)

// channel is init's side of the persistent channel. Only runChannel's goroutine touches it.
type channel struct {
	dialer func() (*os.File, error) // one connection to the host (dialUnix of the socket, or dialNet); nil: none
	follow func() bool              // nil, or: reports that the address to dial moved (follow_linux.go)
	relays <-chan *os.File          // verified relay connections (relay_linux.go); nil: none
	exe    string                   // this binary, for the serve child
	log    *log.Logger              // stderr

	state   channelState
	delay   time.Duration // the wait before the next connect attempt after a failure
	serve   int           // pid of the serve child while serving
	started time.Time     // when the current or last session began
	lastErr syscall.Errno // the last connect failure logged (0: none since the last success), logged once

	cleanEnd bool // the serve child exited 0: dial again without a sweep

	sweepStart time.Time
	sweepPoll  time.Duration
	sweepNoted bool // a slow sweep was logged
}

// runChannel is init with --channel. It must be PID 1: it ends every session with kill(-1, SIGKILL), which from
// PID 1 kills every other process of the PID namespace and from anywhere else would kill far more.
//
// The loop, driven by signals and one timer (it never polls while serving, and a dialling init makes a few
// syscalls per attempt at most five times a second):
//  1. connect to path; on failure retry after 2 ms, doubling up to 200 ms;
//  2. start `serve` with the connection as stdin and stdout, then close init's copy, so the host sees EOF as
//     soon as that child dies;
//  3. reap every zombie; when the reaped pid is the serve child and it died abnormally (killed, or a non-zero
//     exit), kill(-1, SIGKILL) and reap until init has no child left (repeating the kill, paced, for processes
//     forked meanwhile), and only then dial again. A serve that exited 0 ended cleanly (the host hung up while
//     it was idle; it kills each command's tree itself): init dials again without a sweep, which would kill
//     what another host process may have started in the sandbox meanwhile.
//
// A new connection therefore proves that every process of the previous session is gone. Like plain init, it
// ignores every signal (see runInit): the host ends it with SIGKILL through the engine.
func runChannel(path string, relays <-chan *os.File) int {
	var dial func() (*os.File, error)
	if path != "" {
		dial = func() (*os.File, error) { return dialUnix(path) }
	}
	return runChannelFollowing(dial, nil, relays)
}

// runChannelFollowing is runChannel over connections dial makes (the Unix socket, or the network: net_linux.go),
// and the relays' sessions that arrive on relays; either may be nil. Where the address to dial may move
// (follow_linux.go), while no session is up every signal asks follow, and a new address is dialled at once. A
// relay is taken only while no session runs and the last one's sweep is done, exactly when init would dial;
// otherwise it is closed unanswered, which the relay reports as turned away.
func runChannelFollowing(dial func() (*os.File, error), follow func() bool, relays <-chan *os.File) int {
	c := &channel{dialer: dial, follow: follow, relays: relays, exe: selfExe(), log: log.New(os.Stderr, "sandkeep-agent init: ", 0), delay: dialBackoffMin}
	if os.Getpid() != 1 {
		c.log.Printf("--channel needs to run as PID 1 (pid is %d)", os.Getpid())
		return 2
	}
	sigs := notifyInit()
	reapZombies() // children that died before Notify
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-sigs: // any signal may stand for a SIGCHLD (notifyInit); the rest are dropped
			if c.reap() && c.state == sweeping {
				c.sweep(timer)
			}
			if c.cleanEnd {
				c.cleanEnd = false
				c.redial(timer)
			}
			if c.state == dialing && c.follow != nil && c.follow() { // announced: the new owner listens now
				c.delay = dialBackoffMin
				timer.Reset(0)
			}
		case f := <-c.relays:
			c.takeRelay(f)
		case <-timer.C:
			switch c.state {
			case dialing:
				if c.dialer != nil {
					c.dial(timer)
				}
			case sweeping:
				c.sweep(timer)
			}
		}
	}
}

// selfExe is the path to run this binary again. /proc/self/exe names the very file init runs, even when the
// path was replaced since; without /proc, the path init was started with.
func selfExe() string {
	const self = "/proc/self/exe"
	if _, err := os.Stat(self); err == nil {
		return self
	}
	return os.Args[0]
}

// reap collects every exited child. When the serve child is among them it starts the sweep and returns true;
// it also returns true while sweeping, since every death may be the last one.
func (c *channel) reap() bool {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return c.state == sweeping
		}
		if c.state == serving && pid == c.serve {
			c.serve = 0
			if ws.Exited() && ws.ExitStatus() == 0 {
				// A clean end: the host hung up while serve was idle, and serve had already killed every
				// command's tree. Sweeping now would kill whatever the next host process started meanwhile
				// (through the engine's exec), after it took the sandbox's gate.
				c.state, c.cleanEnd = dialing, true
				continue
			}
			// serve died abnormally (a command killed it): nothing of that session may survive.
			c.state = sweeping
			c.sweepStart, c.sweepPoll, c.sweepNoted = time.Now(), sweepPollMin, false
		}
	}
}

// sweep kills every other process of the namespace and reaps; when init has no child left it dials again, at
// once after a healthy session, otherwise after the backoff. Until then it repeats, paced by the timer, since
// a process may have forked while the first SIGKILL went out or be slow to die.
func (c *channel) sweep(timer *time.Timer) {
	_ = syscall.Kill(-1, syscall.SIGKILL) // ESRCH: nothing else runs; EPERM targets cannot be helped
	if !c.noChildren() {
		if !c.sweepNoted && time.Since(c.sweepStart) > sweepSlow {
			c.sweepNoted = true
			c.log.Printf("processes of the last session survive SIGKILL for %v; not reconnecting until they are gone",
				sweepSlow)
		}
		timer.Reset(c.sweepPoll)
		c.sweepPoll = min(2*c.sweepPoll, sweepPollMax)
		return
	}
	c.state = dialing
	c.redial(timer)
}

// redial dials again at once after a healthy session, otherwise after the backoff.
func (c *channel) redial(timer *time.Timer) {
	if time.Since(c.started) >= healthySession {
		c.delay = dialBackoffMin
		timer.Reset(0)
		return
	}
	c.retryLater(timer)
}

// noChildren reaps what has exited and reports whether init has no child at all. Every process of the last
// session is a child of init by now: its ancestors up to the serve child are dead, and orphans reparent to PID 1.
func (c *channel) noChildren() bool {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		switch {
		case err == syscall.EINTR, err == nil && pid > 0:
			continue
		case err == syscall.ECHILD:
			return true
		default: // 0: children remain, none has exited yet
			return false
		}
	}
}

// retryLater arms the timer for the next connect attempt and doubles the wait after it.
func (c *channel) retryLater(timer *time.Timer) {
	timer.Reset(c.delay)
	c.delay = min(2*c.delay, dialBackoffMax)
}

// dial tries one connection and, on success, starts the serve child on it.
func (c *channel) dial(timer *time.Timer) {
	conn, err := c.dialer()
	if err != nil {
		c.noteDialError(err)
		c.retryLater(timer)
		return
	}
	c.lastErr = 0
	c.started = time.Now()
	pid, err := c.startServe(conn)
	conn.Close() // the child has its own copies; with this one closed, its death is EOF for the host
	if err != nil {
		c.log.Printf("start serve: %v", err)
		c.retryLater(timer)
		return
	}
	c.state, c.serve = serving, pid
}

// takeRelay starts the serve child on a verified relay connection when no session runs, and turns it away
// otherwise.
func (c *channel) takeRelay(f *os.File) {
	defer f.Close() // the child has its own copy; with this one closed, its death is EOF for the relay
	if c.state != dialing {
		return
	}
	if _, err := f.Write([]byte{relayAccept}); err != nil {
		return
	}
	c.started = time.Now()
	pid, err := c.startServe(f)
	if err != nil {
		c.log.Printf("start serve for a relay: %v", err)
		return
	}
	c.state, c.serve = serving, pid
}

// noteDialError logs a connect failure unless it is the host not listening (the socket missing, refusing, or
// its backlog full) or the same failure as the last one logged.
func (c *channel) noteDialError(err error) {
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EAGAIN) ||
		errors.Is(err, os.ErrDeadlineExceeded) { // the network channel's server not answering (net_linux.go)
		return
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if errno == c.lastErr {
			return
		}
		c.lastErr = errno
	}
	c.log.Printf("%v (retrying every %v)", err, dialBackoffMax)
}

// startServe starts `sandkeep-agent serve` with conn as its stdin and stdout and init's stderr.
func (c *channel) startServe(conn *os.File) (int, error) {
	p, err := os.StartProcess(c.exe, []string{os.Args[0], "serve"}, &os.ProcAttr{
		Env:   os.Environ(),
		Files: []*os.File{conn, conn, os.Stderr},
	})
	if err != nil {
		return 0, err
	}
	pid := p.Pid
	_ = p.Release() // reaped by wait4(-1) like every other child
	return pid, nil
}

// dialUnix connects a Unix stream socket to path from the calling process and returns it in blocking mode,
// close-on-exec. The connect is non-blocking so that a listener with a full backlog is a failure (EAGAIN) to
// retry, not a wait that would hold up init; a Unix connect otherwise completes at once.
func dialUnix(path string) (*os.File, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		syscall.Close(fd)
		return nil, &os.PathError{Op: "connect", Path: path, Err: err}
	}
	if err := syscall.SetNonblock(fd, false); err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	return os.NewFile(uintptr(fd), path), nil
}
