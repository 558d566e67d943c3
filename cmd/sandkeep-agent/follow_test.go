//go:build linux

package main

import (
	"bytes"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// TestFollower: init follows a genuine announcement that is newer than the last it followed, and nothing else a
// command in the pod could write there: a forged or replayed one, a link, a FIFO (which would block a plain read).
func TestFollower(t *testing.T) {
	dir := t.TempDir()
	token := []byte(strings.Repeat("ab", 32))
	fw := newFollower(initFlags{netChannel: "10.0.0.1:7070", pod: "pod-a", tokenFile: filepath.Join(dir, "token")},
		token, log.New(io.Discard, "", 0))
	file := filepath.Join(dir, announceName)
	write := func(a agentproto.Announcement, tok []byte) {
		t.Helper()
		b, err := agentproto.FormatAnnouncement(a, "pod-a", tok)
		if err != nil {
			t.Fatal(err)
		}
		if err := announce(file, b); err != nil {
			t.Fatal(err)
		}
	}
	if fw.check() || fw.current() != "10.0.0.1:7070" {
		t.Fatalf("no announcement: check moved to %s", fw.current())
	}
	write(agentproto.Announcement{Seq: 5, Addr: "10.0.0.2:7070"}, token)
	if !fw.check() || fw.current() != "10.0.0.2:7070" {
		t.Fatalf("genuine announcement: dialling %s", fw.current())
	}
	if fw.check() {
		t.Fatal("the same announcement read again moved the channel")
	}
	write(agentproto.Announcement{Seq: 9, Addr: "10.0.0.66:7070"}, []byte(strings.Repeat("cd", 32)))
	if fw.check() || fw.current() != "10.0.0.2:7070" {
		t.Fatalf("an announcement under another token was followed: dialling %s", fw.current())
	}
	write(agentproto.Announcement{Seq: 4, Addr: "10.0.0.3:7070"}, token)
	if fw.check() || fw.current() != "10.0.0.2:7070" {
		t.Fatalf("an older announcement (a replay) was followed: dialling %s", fw.current())
	}
	os.Remove(file)
	if err := syscall.Mkfifo(file, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan bool, 1)
	go func() { done <- fw.check() }()
	select {
	case moved := <-done:
		if moved {
			t.Fatal("a FIFO moved the channel")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("check blocked on a FIFO")
	}
	os.Remove(file)
	elsewhere := filepath.Join(dir, "elsewhere")
	b, _ := agentproto.FormatAnnouncement(agentproto.Announcement{Seq: 10, Addr: "10.0.0.4:7070"}, "pod-a", token)
	if err := os.WriteFile(elsewhere, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, file); err != nil {
		t.Fatal(err)
	}
	if fw.check() || fw.current() != "10.0.0.2:7070" {
		t.Fatalf("a link was followed: dialling %s", fw.current())
	}
	if code, _ := announceBuiltin([]string{"announce", file, "SKAN 1 1 10.0.0.5:7070 00"}); code == 0 {
		t.Error("announce wrote a malformed announcement")
	}
}

// TestNetInitFollows: init as PID 1 with --net-channel, whose address nobody serves (its replica is gone), dials
// the address a genuine announcement names as soon as `sandkeep-agent announce` (run inside the sandbox, as the
// new owner's exec does) signals it, and opens the connection with its pod's hello; a forged announcement that
// came first sent it nowhere.
func TestNetInitFollows(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the channel tests need root to create PID namespaces")
	}
	dir := t.TempDir()
	token := strings.Repeat("ef", 32)
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o400); err != nil {
		t.Fatal(err)
	}
	gone := freeAddr(t) // the dead replica's address: nothing listens
	owner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	forged, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer forged.Close()

	cmd := exec.Command("unshare", "--pid", "--fork", "--kill-child", agentBin, "init",
		"--net-channel", gone, "--pod", "pod-a", "--token-file", tokenFile)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sb := &sandbox{cmd: cmd, done: make(chan error, 1)}
	go func() { sb.done <- cmd.Wait() }()
	defer sb.stop(t)
	for deadline := time.Now().Add(10 * time.Second); sb.init == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, pid := range childrenOf(cmd.Process.Pid) {
			if exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); exe == agentBin {
				sb.init = pid
			}
		}
	}
	if sb.init == 0 {
		t.Fatal("agent init did not start")
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Lstat(tokenFile); os.IsNotExist(err) {
			break // init took the token
		}
		if time.Now().After(deadline) {
			t.Fatal("init did not take its token")
		}
	}
	// Backoff reaches its longest wait before anything is announced, as for a replica dead for a while.
	time.Sleep(time.Second)
	announceIn := func(b []byte) {
		t.Helper()
		out, err := exec.Command("nsenter", "--target", strconv.Itoa(sb.init), "--pid", "--",
			agentBin, "announce", filepath.Join(dir, announceName), string(b)).CombinedOutput()
		if err != nil {
			t.Fatalf("announce: %v: %s", err, out)
		}
	}
	bad, _ := agentproto.FormatAnnouncement(agentproto.Announcement{Seq: 2, Addr: forged.Addr().String()}, "pod-a",
		bytes.Repeat([]byte("x"), 64))
	announceIn(bad)
	got := make(chan net.Conn, 1)
	go func() {
		if c, err := forged.Accept(); err == nil {
			got <- c
		}
	}()
	select {
	case c := <-got:
		c.Close()
		t.Fatal("init dialled the address of a forged announcement")
	case <-time.After(500 * time.Millisecond):
	}

	good, err := agentproto.FormatAnnouncement(agentproto.Announcement{Seq: 1, Addr: owner.Addr().String()}, "pod-a", []byte(token))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	announceIn(good)
	_ = owner.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	c, err := owner.Accept()
	if err != nil {
		t.Fatalf("init did not dial the announced address: %v", err)
	}
	defer c.Close()
	took := time.Since(began)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	h, err := agentproto.ReadHello(c)
	if err != nil || h.Name != "pod-a" || string(h.Token) != token || h.Egress {
		t.Fatalf("hello = %+v, %v; want pod-a's with its token", h, err)
	}
	t.Logf("announced to connected: %v (the announce exec included)", took)
}

// freeAddr is a loopback address nothing listens on (it was free a moment ago).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
