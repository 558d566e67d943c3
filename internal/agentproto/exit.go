package agentproto

import "syscall"

// ExitFromWait maps a wait status to the exit code a shell would report: a process that exited gives its code
// and signal 0; one killed by signal N gives 128+N and N (SIGTERM 143, SIGKILL 137, SIGSEGV 139). A status that
// is neither (stopped, continued: not seen without WUNTRACED) gives 255 and 0.
func ExitFromWait(ws syscall.WaitStatus) (code, signal int) {
	switch {
	case ws.Exited():
		return ws.ExitStatus(), 0
	case ws.Signaled():
		return 128 + int(ws.Signal()), int(ws.Signal())
	}
	return 255, 0
}
