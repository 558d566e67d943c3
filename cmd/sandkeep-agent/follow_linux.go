package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// Agents follow their key's owner. In a fleet the replica that made a pod may die, and another takes the pod's
// key over; the pod's agent would dial the dead replica's address forever. The new owner writes an announcement
// (agentproto.Announcement: an address, a sequence number, a MAC under the pod's channel token) into the pod's
// token directory with `sandkeep-agent announce` through the API server's exec, which then signals PID 1. Init
// reads the file before every connect attempt and at every signal while it is not connected, and follows a
// genuine announcement newer than the last it followed. A connected session is never cut for one: its server
// may still be running a command (the announcement is read when that session ends).
const announceName = "announce" // the announcement's file, next to the token file (kube.AnnounceFile)

// follower is where init's channel goes: the --net-channel address until an announcement says otherwise.
type follower struct {
	file  string
	pod   string
	token []byte
	log   *log.Logger

	addr    atomic.Pointer[string] // read by the egress forwarder's goroutines too
	seq     uint64                 // the last announcement followed (0: the --net-channel address); init's loop only
	lastErr string                 // the last refusal logged, so a command rewriting the file cannot flood stderr
}

func newFollower(f initFlags, token []byte, logger *log.Logger) *follower {
	fw := &follower{file: filepath.Join(filepath.Dir(f.tokenFile), announceName), pod: f.pod,
		token: append([]byte(nil), token...), log: logger}
	addr := f.netChannel
	fw.addr.Store(&addr)
	return fw
}

// current is the address to dial now.
func (fw *follower) current() string { return *fw.addr.Load() }

// check reads the announcement and follows it when it is genuine and newer; it reports whether the address
// changed. A missing file is the common case and says nothing.
func (fw *follower) check() bool {
	b, err := readAnnouncement(fw.file)
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	var a agentproto.Announcement
	if err == nil {
		a, err = agentproto.ParseAnnouncement(b, fw.pod, fw.token)
	}
	if err != nil {
		if msg := err.Error(); msg != fw.lastErr {
			fw.lastErr = msg
			fw.log.Printf("channel announcement refused: %v", err)
		}
		return false
	}
	if a.Seq <= fw.seq {
		return false
	}
	fw.seq = a.Seq
	if a.Addr == fw.current() {
		return false
	}
	fw.addr.Store(&a.Addr)
	fw.log.Printf("channel announcement %d: dialling %s", a.Seq, a.Addr)
	return true
}

// readAnnouncement reads at most an announcement's length of path: a regular file, never through a link, and
// never a FIFO or a device a command put there to block init.
func readAnnouncement(path string) ([]byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	return io.ReadAll(io.LimitReader(f, agentproto.MaxAnnouncement+1))
}

// announceBuiltin runs `sandkeep-agent announce FILE ANNOUNCEMENT`: the new owner's side, through the API
// server's exec. It checks the announcement's form (the MAC is init's to check), replaces FILE with it at once
// (a temporary file renamed over it, so init never reads half of one), and signals PID 1 to read it now.
func announceBuiltin(args []string) (int, bool) {
	if len(args) == 0 || args[0] != "announce" {
		return 0, false
	}
	if len(args) != 3 || !filepath.IsAbs(args[1]) {
		fmt.Fprintln(os.Stderr, "usage: sandkeep-agent announce /ABSOLUTE/FILE ANNOUNCEMENT")
		return 2, true
	}
	if err := announce(args[1], []byte(args[2])); err != nil {
		fmt.Fprintf(os.Stderr, "sandkeep-agent announce: %v\n", err)
		return 1, true
	}
	return 0, true
}

func announce(path string, line []byte) error {
	line = bytes.TrimSuffix(line, []byte("\n"))
	if _, _, err := agentproto.SplitAnnouncement(line); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".announce-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // gone after the rename; there after a failure
	if _, err := tmp.Write(append(line, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	// Init reads it at its next connect attempt anyway (at most dialBackoffMax from now); the signal makes that
	// now. Init ignores every signal otherwise (init_linux.go), so a command's signals change nothing.
	_ = syscall.Kill(1, syscall.SIGUSR1)
	return nil
}
