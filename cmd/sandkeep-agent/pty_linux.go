package main

import (
	"errors"
	"os"
	"strconv"
	"syscall"
	"unsafe"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// A TTY command runs on a pseudo-terminal of its own: the agent opens /dev/ptmx (the sandbox's devpts
// instance), keeps the master and hands the slave to the command as its stdin, stdout, stderr and controlling
// terminal. Only ioctls of the standard syscall package are used: the agent stays stdlib-only and static.

// openPTY returns a new pseudo-terminal's master (non-blocking, so that the runtime's poller serves it and read
// deadlines work) and slave, the window already set to ws.
func openPTY(ws agentproto.WindowSize) (master, slave *os.File, err error) {
	fd, err := syscall.Open("/dev/ptmx", syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, errors.New("open /dev/ptmx: " + errText(err))
	}
	m := os.NewFile(uintptr(fd), "/dev/ptmx")
	var unlock int32
	if err := ioctl(fd, syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)); err != nil {
		m.Close()
		return nil, nil, errors.New("unlock pty: " + errText(err))
	}
	var n uint32
	if err := ioctl(fd, syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		m.Close()
		return nil, nil, errors.New("pty number: " + errText(err))
	}
	name := "/dev/pts/" + strconv.FormatUint(uint64(n), 10)
	sfd, err := syscall.Open(name, syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		m.Close()
		return nil, nil, errors.New("open " + name + ": " + errText(err))
	}
	s := os.NewFile(uintptr(sfd), name)
	if err := setWindow(m, ws); err != nil {
		m.Close()
		s.Close()
		return nil, nil, errors.New("set window size: " + errText(err))
	}
	return m, s, nil
}

// winsize is struct winsize of <asm-generic/termios.h>.
type winsize struct {
	Row, Col, Xpixel, Ypixel uint16
}

// setWindow sets the terminal's size; the kernel sends SIGWINCH to its foreground process group.
func setWindow(master *os.File, ws agentproto.WindowSize) error {
	raw, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := raw.Control(func(fd uintptr) {
		w := winsize{Row: ws.Rows, Col: ws.Cols}
		ierr = ioctl(int(fd), syscall.TIOCSWINSZ, unsafe.Pointer(&w))
	}); err != nil {
		return err
	}
	return ierr
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// dupFile returns a second, independent *os.File for f's descriptor (the stdin feeder closes its own).
func dupFile(f *os.File) (*os.File, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var nfd int
	var derr error
	if err := raw.Control(func(fd uintptr) {
		nfd, derr = syscall.Dup(int(fd))
		if derr == nil {
			syscall.CloseOnExec(nfd)
		}
	}); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	return os.NewFile(uintptr(nfd), f.Name()), nil
}
