package main

import (
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"syscall"
	"time"
)

// The relay: a session of the persistent channel carried by the engine's exec instead of a host socket, for the
// sandboxes whose PID 1 cannot reach one (gVisor, whose gofer stands between a sandbox and a host Unix socket)
// or whose operator chose the exec transport (a remote engine: no host directory to share). The host execs
// `sandkeep-agent relay` as uid 0 through the engine (docker exec -u 0); the relay connects to init's abstract
// socket in the sandbox's own network namespace and carries the session's bytes between that socket and its
// exec's stdin and stdout. Init hands the connection to a serve child exactly as it does a host connection
// (channel_linux.go): one session at a time, a sweep of the namespace after a session that ended badly, so a
// new session still proves the sandbox clean.
//
// Who is who:
//   - Init believes a relay only from uid 0, read from the SCM_CREDENTIALS the kernel (or gVisor's sentry)
//     checks at the sender: a process may claim only its own ids unless it holds CAP_SETUID/CAP_SETGID, and a
//     sandbox holds no capability. The sandbox's user is never 0 for a relay to be accepted (init refuses every
//     relay when it runs as uid 0 itself), its commands cannot become 0 (no-new-privileges, every capability
//     dropped, no setuid effect), so only the engine's exec with -u 0 makes such a process. (SO_PEERCRED is not
//     used: gVisor answers it with the caller's own credentials.)
//   - The relay believes the socket's name: init binds it before any other process of the sandbox exists and
//     holds it until the sandbox ends, so nothing else can listen there. (The challenge's credentials cannot
//     say more: gVisor reports init's pid from another PID namespace than the exec's.)
const (
	// relaySocket is init's relay listener: an abstract Unix socket, so nothing on a filesystem can be planted
	// in its place, scoped to the sandbox's network namespace. Init binds it before any command exists and never
	// closes it, so no command can take the name.
	relaySocket = "@sandkeep-agent-relay"
	// relayChallenge and relayHello are the handshake's two messages, each sent with its sender's
	// credentials; relayAccept is init's last byte, sent once a serve child will take the session.
	relayChallenge = 'C'
	relayHello     = 'H'
	relayAccept    = 'A'
	// relayHandshake bounds each side's wait in the handshake; relaysInFlight bounds the handshakes init runs
	// at once, so a command that connects and says nothing holds up a real relay by at most this much.
	relayHandshake = time.Second
	relaysInFlight = 4
	// relayReady is the line the relay writes on its stdout once init took the session; the host reads it
	// before it speaks the agent wire (internal/driver/docker's Relay names the same line).
	relayReady = "ok\n"
)

// listenRelay binds init's relay socket. It must be called by PID 1 before any other process exists.
func listenRelay() (int, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: relaySocket}); err != nil {
		syscall.Close(fd)
		return -1, os.NewSyscallError("bind "+relaySocket, err)
	}
	if err := syscall.Listen(fd, 8); err != nil {
		syscall.Close(fd)
		return -1, os.NewSyscallError("listen", err)
	}
	return fd, nil
}

// acceptRelays accepts connections on lfd for ever and sends each one whose peer proved itself a relay to out,
// as a blocking *os.File. Handshakes run concurrently, at most relaysInFlight at once.
func acceptRelays(lfd int, out chan<- *os.File, logger *log.Logger) {
	slots := make(chan struct{}, relaysInFlight)
	for {
		fd, _, err := syscall.Accept4(lfd, syscall.SOCK_CLOEXEC)
		if err != nil {
			if err == syscall.EINTR || err == syscall.ECONNABORTED || err == syscall.EMFILE || err == syscall.ENFILE {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			logger.Printf("relay accept: %v (no more relays)", err)
			return
		}
		slots <- struct{}{}
		go func() {
			defer func() { <-slots }()
			if err := verifyRelay(fd); err != nil {
				logger.Printf("relay refused: %v", err)
				syscall.Close(fd)
				return
			}
			out <- os.NewFile(uintptr(fd), "relay")
		}()
	}
}

// verifyRelay runs init's side of the handshake on fd: the challenge with init's credentials, then the relay's
// hello, whose credentials must say uid 0.
func verifyRelay(fd int) error {
	if os.Getuid() == 0 {
		return errors.New("init runs as uid 0, so a command could claim it too")
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_PASSCRED, 1); err != nil {
		return os.NewSyscallError("SO_PASSCRED", err)
	}
	tv := syscall.NsecToTimeval(relayHandshake.Nanoseconds())
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		return os.NewSyscallError("SO_RCVTIMEO", err)
	}
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &tv); err != nil {
		return os.NewSyscallError("SO_SNDTIMEO", err)
	}
	if err := sendCreds(fd, relayChallenge); err != nil {
		return err
	}
	cred, err := recvCreds(fd, relayHello)
	if err != nil {
		return err
	}
	if cred.Uid != 0 {
		return fmt.Errorf("peer pid %d has uid %d, not 0", cred.Pid, cred.Uid)
	}
	// The session's own reads and writes block without a bound, as on the host channel.
	var zero syscall.Timeval
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &zero)
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &zero)
	return nil
}

// sendCreds sends the one byte b with this process's own credentials attached.
func sendCreds(fd int, b byte) error {
	oob := syscall.UnixCredentials(&syscall.Ucred{Pid: int32(os.Getpid()), Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())})
	if err := syscall.Sendmsg(fd, []byte{b}, oob, nil, 0); err != nil {
		return os.NewSyscallError("sendmsg", err)
	}
	return nil
}

// recvCreds reads the one byte want and the credentials the kernel attached to it.
func recvCreds(fd int, want byte) (*syscall.Ucred, error) {
	buf := make([]byte, 1)
	oob := make([]byte, syscall.CmsgSpace(syscall.SizeofUcred))
	for {
		n, oobn, _, _, err := syscall.Recvmsg(fd, buf, oob, 0)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, os.NewSyscallError("recvmsg", err)
		}
		if n != 1 || buf[0] != want {
			return nil, fmt.Errorf("handshake: got %q, want %q", buf[:n], want)
		}
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			return nil, errors.New("handshake: no credentials attached")
		}
		return syscall.ParseUnixCredentials(&msgs[0])
	}
}

// relayBuiltin runs `sandkeep-agent relay`: the relay's end inside the sandbox (see above).
func relayBuiltin(args []string) (int, bool) {
	if len(args) == 0 || args[0] != "relay" {
		return 0, false
	}
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: sandkeep-agent relay")
		return 2, true
	}
	return relay(os.Stdin, os.Stdout), true
}

func relay(in io.Reader, out io.Writer) int {
	logger := log.New(os.Stderr, "sandkeep-agent relay: ", 0)
	f, err := dialRelay()
	if err != nil {
		logger.Printf("%v", err)
		return 1
	}
	defer f.Close()
	if _, err := io.WriteString(out, relayReady); err != nil {
		return 1
	}
	// The host's frames: at their end (the host left), half-close, so serve reads EOF and ends the session.
	// This goroutine ends with the process (it may sit in a Read of stdin, which cannot be interrupted).
	go func() {
		_, _ = io.Copy(f, in)
		_ = syscall.Shutdown(int(f.Fd()), syscall.SHUT_WR)
	}()
	_, _ = io.Copy(out, f) // serve's frames, until the session ends
	return 0
}

// dialRelay connects to init's relay socket and runs the relay's side of the handshake: init's challenge, the
// hello with the relay's credentials, and init's accept byte says a serve child takes the session (init turns a relay away while
// another session runs, or while it sweeps after one).
func dialRelay() (*os.File, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	f := os.NewFile(uintptr(fd), "relay")
	fail := func(err error) (*os.File, error) { f.Close(); return nil, err }
	// Before connect: init's challenge may arrive at once, and the kernel attaches credentials only to what
	// arrives after SO_PASSCRED is on (gVisor attaches none otherwise).
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_PASSCRED, 1); err != nil {
		return fail(os.NewSyscallError("SO_PASSCRED", err))
	}
	tv := syscall.NsecToTimeval((5 * relayHandshake).Nanoseconds()) // init may be busy with other handshakes
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		return fail(os.NewSyscallError("SO_RCVTIMEO", err))
	}
	if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: relaySocket}); err != nil {
		return fail(fmt.Errorf("connect to init's relay socket: %w (is the sandbox's init started with --relay?)", err))
	}
	if _, err := recvCreds(fd, relayChallenge); err != nil {
		return fail(err)
	}
	if err := sendCreds(fd, relayHello); err != nil {
		return fail(err)
	}
	var b [1]byte
	for {
		n, err := syscall.Read(fd, b[:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n != 1 || b[0] != relayAccept {
			return fail(errors.New("init turned the relay away: another session is up, or the last one's processes are still being killed"))
		}
		break
	}
	var zero syscall.Timeval
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &zero)
	return f, nil
}
