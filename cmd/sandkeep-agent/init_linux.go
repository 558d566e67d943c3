package main

import (
	"log"
	"os"
	"os/signal"
	"syscall"
)

// runInit is PID 1 of a sandbox. Orphans of the whole PID namespace reparent to it, so it reaps every zombie.
// It ignores every signal: the only ones that could reach it come from its own commands (the kernel delivers
// nothing else to a namespace's init but SIGKILL and SIGSTOP from outside), so the host stops a sandbox with
// SIGKILL through the engine (Posture.StopSignal) and a command's `kill -TERM 1` changes nothing. It blocks on
// signals and never polls. With a channel path it also keeps the persistent channel to the host up (see runChannel),
// with relay it also takes the channel's sessions from relays the host execs (see relay_linux.go), and with an
// egress address it forwards that address to the host's egress proxy (see startEgress).
func runInit(channel, egress string, relay bool) int {
	logger := log.New(os.Stderr, "sandkeep-agent init: ", 0)
	if os.Getpid() == 1 {
		fixTmp()
	}
	if egress != "" && os.Getpid() == 1 {
		startEgress(egress, channel, logger)
	}
	var relays chan *os.File
	if relay && os.Getpid() == 1 {
		if lfd, err := listenRelay(); err != nil {
			logger.Printf("%v (no relays)", err)
		} else {
			relays = make(chan *os.File)
			go acceptRelays(lfd, relays, logger)
		}
	}
	if channel != "" || relays != nil {
		return runChannel(channel, relays)
	}
	sigs := notifyInit()
	reapZombies() // children that died before Notify
	for range sigs {
		reapZombies() // one SIGCHLD may stand for several exits; any other signal is dropped
	}
	return 0
}

// notifyInit routes every signal to the returned channel. Go installs a handler for every signal, and a
// namespace's init receives from inside exactly the signals it handles, so without Notify a command's SIGTERM,
// SIGHUP, SIGUSR1... would end PID 1 through the runtime's default action. Notified, they are only values to
// drop. Every signal counts as a possible SIGCHLD: when a command floods PID 1 and the channel is full, a dropped
// SIGCHLD is made up for by the signals still queued, each of which reaps.
func notifyInit() <-chan os.Signal {
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs)
	return sigs
}

// prSetDumpable is PR_SET_DUMPABLE from <linux/prctl.h>.
const prSetDumpable = 4

// setNotDumpable makes this process non-dumpable: its /proc entries (mem, environ, fd, maps) belong to root and
// ptrace_may_access refuses every process of the same uid, so a command cannot read or steer the agent that runs
// it. execve resets the flag, so init and serve each set it again as they start (main).
func setNotDumpable() error {
	_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// reapZombies collects every child that has exited, without blocking.
func reapZombies() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
	}
}

// fixTmp gives /tmp the mode 1777 it is meant to have. runc sets a tmpfs's mode to that of the image's
// directory it covers (some images ship /tmp as 0755 root); the posture mounts /tmp owned by the sandbox user,
// so init, running as that user, can put the mode right. Nothing is done for root or for a /tmp of another owner.
func fixTmp() {
	fi, err := os.Stat("/tmp")
	if err != nil {
		return
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	uid := os.Getuid()
	if !ok || uid == 0 || int(st.Uid) != uid || fi.Mode()&(os.ModePerm|os.ModeSticky) == os.ModeSticky|0o777 {
		return
	}
	if err := os.Chmod("/tmp", os.ModeSticky|0o777); err != nil {
		log.New(os.Stderr, "sandkeep-agent init: ", 0).Printf("chmod /tmp: %v", err)
	}
}
