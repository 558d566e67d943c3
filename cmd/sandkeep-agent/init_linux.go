package main

import (
	"log"
	"os"
	"os/signal"
	"syscall"
)

// runInit is PID 1 of a sandbox. Orphans of the whole PID namespace reparent to it, so it reaps every zombie;
// on SIGTERM or SIGINT it exits 0 and the kernel kills the rest of the namespace. It blocks on signals and
// never polls. With a channel path it also keeps the persistent channel to the host up (see runChannel), and
// with an egress address it forwards that address to the host's egress proxy (see startEgress).
func runInit(channel, egress string) int {
	if egress != "" && os.Getpid() == 1 {
		startEgress(egress, channel, log.New(os.Stderr, "sandkeep-agent init: ", 0))
	}
	if channel != "" {
		return runChannel(channel)
	}
	sigs := notifyInit()
	reapZombies() // children that died before Notify
	for sig := range sigs {
		switch sig {
		case syscall.SIGCHLD:
			reapZombies() // one SIGCHLD may stand for several exits
		case syscall.SIGTERM, syscall.SIGINT:
			return 0
		}
	}
	return 0
}

// notifyInit routes the signals PID 1 cares about, and those a command may send it, to the returned channel.
// Go handles every signal; without Notify some (SIGHUP, SIGUSR1...) would end PID 1, which a command can send.
// Listening to them here makes them harmless.
func notifyInit() <-chan os.Signal {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT,
		syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE)
	return sigs
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
