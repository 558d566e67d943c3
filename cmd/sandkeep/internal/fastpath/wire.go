package fastpath

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"

	"github.com/sandkeep/sandkeep/internal/homedir"
)

// The daemon's socket, lock and log, in the state home.
const (
	SocketName = "daemon.sock"
	LockName   = "daemon.lock"
	LogName    = "daemon.log"
)

// Frame types of the socket protocol: a type byte, a big-endian uint32 length, the payload.
const (
	FrameHello    = 'H' // client: JSON Hello
	FrameStdin    = 'I' // client: stdin bytes
	FrameStdinEOF = 'E' // client: stdin ended
	FrameSignal   = 'S' // client: one byte, the signal that interrupted the caller
	FrameAccept   = 'A' // daemon: the call is served (for a control call: JSON status)
	FrameRefuse   = 'M' // daemon: JSON {code, message, hint}: not served (another environment, not the owner)
	FrameStdout   = 'O' // daemon: stdout bytes
	FrameStderr   = 'R' // daemon: stderr bytes
	FrameWant     = 'W' // daemon: the command reads its stdin: start sending it
	FrameExit     = 'X' // daemon: four bytes, the exit status
)

// MaxFrame bounds one frame's payload.
const MaxFrame = 1 << 20

// Hello is a connection's first frame: a control word, or a call (the command line and the caller's fingerprint).
type Hello struct {
	Control     string   `json:"control,omitempty"` // "", "status" or "stop"
	Args        []string `json:"args,omitempty"`
	Fingerprint string   `json:"fingerprint,omitempty"`
}

// Conn reads and writes frames on one connection (a *net.UnixConn in the daemon, an *os.File here); writes
// are serialised.
type Conn struct {
	C  io.ReadWriteCloser
	mu sync.Mutex
}

// Write sends one frame.
func (f *Conn) Write(typ byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var h [5]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], uint32(len(p)))
	if _, err := f.C.Write(h[:]); err != nil {
		return err
	}
	_, err := f.C.Write(p)
	return err
}

// WriteData splits p into frames of at most MaxFrame bytes.
func (f *Conn) WriteData(typ byte, p []byte) error {
	for len(p) > 0 {
		n := min(len(p), MaxFrame)
		if err := f.Write(typ, p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// Read reads one frame.
func (f *Conn) Read() (byte, []byte, error) { return ReadFrame(f.C) }

// ReadFrame reads one frame: a type byte, a big-endian uint32 length of at most MaxFrame, the payload.
func ReadFrame(r io.Reader) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("frame of %d bytes", n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	return h[0], p, nil
}

// Dial connects to the home's daemon. It uses the socket system calls rather than package net, whose init runs
// late in a big binary (see the package doc).
func Dial(home string) (*Conn, error) {
	path := homedir.Join(home, SocketName)
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	for {
		err = syscall.Connect(fd, &syscall.SockaddrUnix{Name: path})
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		_ = syscall.Close(fd)
		return nil, &os.PathError{Op: "connect", Path: path, Err: err}
	}
	return &Conn{C: os.NewFile(uintptr(fd), path)}, nil
}
