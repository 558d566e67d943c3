package fastpath

import (
	"errors"
	"io"
	"os"
	"strconv"
	"sync"
	"syscall"
	"unicode/utf8"

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
	putUint32(h[1:], uint32(len(p)))
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
	n := Uint32(h[1:])
	if n > MaxFrame {
		return 0, nil, errors.New("frame of " + strconv.FormatUint(uint64(n), 10) + " bytes")
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

// putUint32 and Uint32 are encoding/binary's BigEndian (which imports reflect) for the frames' four-byte fields.
func putUint32(b []byte, v uint32) {
	_ = b[3]
	b[0], b[1], b[2], b[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
}

// Uint32 reads a big-endian uint32 from the first four bytes of b.
func Uint32(b []byte) uint32 {
	_ = b[3]
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// Marshal is json.Marshal of h, byte for byte (FuzzHelloMarshal checks it against encoding/json), written by hand
// so that this package does not import encoding/json (see the package doc). The daemon reads it with
// encoding/json.
func (h Hello) Marshal() []byte {
	b := make([]byte, 0, 64+len(h.Fingerprint))
	b = append(b, '{')
	sep := func() {
		if len(b) > 1 {
			b = append(b, ',')
		}
	}
	if h.Control != "" {
		b = append(b, `"control":`...)
		b = appendJSONString(b, h.Control)
	}
	if len(h.Args) > 0 {
		sep()
		b = append(b, `"args":[`...)
		for i, a := range h.Args {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, a)
		}
		b = append(b, ']')
	}
	if h.Fingerprint != "" {
		sep()
		b = append(b, `"fingerprint":`...)
		b = appendJSONString(b, h.Fingerprint)
	}
	return append(b, '}')
}

// appendJSONString appends s as encoding/json writes a string with its default HTML escaping: '"' and '\\' and
// the control characters escaped (b, f, n, r and t short, the others as u00xx), '<', '>' and '&' as u003c, u003e
// and u0026, U+2028 and U+2029 as u2028 and u2029, and each byte of invalid UTF-8 as ufffd.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
