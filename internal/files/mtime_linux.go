package files

import (
	"os"
	"syscall"
	"time"
	"unsafe"
)

// setMtime sets h's access and modification times to t, through the descriptor (futimens).
func setMtime(h *os.File, t time.Time) error {
	ts := syscall.NsecToTimespec(t.UnixNano())
	c, err := h.SyscallConn()
	if err != nil {
		return err
	}
	var uerr error
	if err := c.Control(func(fd uintptr) { uerr = futimens(int(fd), &[2]syscall.Timespec{ts, ts}) }); err != nil {
		return err
	}
	return uerr
}

// futimens is utimensat(fd, NULL, times, 0): it sets the times of the file open as fd, with no name to resolve.
func futimens(fd int, times *[2]syscall.Timespec) error {
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(times)), 0, 0, 0)
		switch e {
		case 0:
			return nil
		case syscall.EINTR:
			continue
		default:
			return e
		}
	}
}
