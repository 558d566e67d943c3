package main

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	hostchannel "github.com/sandkeep/sandkeep/internal/channel"
)

// TestEgressForwarder runs init's forwarder against the host's side listener (this process stands for both; the
// listener takes it as the sandbox's init): a connection to the sandbox's proxy address reaches the host as the
// command's own TCP socket (handed off, so the host's copies splice it and init copies nothing), and, once a
// handoff has failed, as bytes init copies over the Unix connection. Either way a byte round trip works and the
// host's close ends the command's connection.
func TestEgressForwarder(t *testing.T) {
	dir, err := os.MkdirTemp("", "skeg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	side, err := hostchannel.ListenSide(dir, hostchannel.EgressSocketName, func(pid int) bool { return pid == os.Getpid() }, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer side.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sock := filepath.Join(dir, egressSocketName)
	go forwardEgress(ln, func() (net.Conn, error) { return net.DialTimeout("unix", sock, egressDialTimeout) })
	t.Cleanup(func() { noHandoff.Store(false) })

	for _, tc := range []struct {
		name   string
		stream bool
	}{{"handoff", false}, {"stream", true}} {
		t.Run(tc.name, func(t *testing.T) {
			noHandoff.Store(tc.stream)
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				h, err := side.Accept()
				if err != nil {
					t.Error(err)
				}
				accepted <- h
			}()
			var h net.Conn
			select {
			case h = <-accepted:
			case <-time.After(10 * time.Second):
				t.Fatal("the host accepted nothing")
			}
			if h == nil {
				t.FailNow()
			}
			_, isUnix := h.(*net.UnixConn)
			if isUnix != tc.stream {
				t.Fatalf("the host serves a %T (stream %v)", h, tc.stream)
			}
			for _, p := range [][2]net.Conn{{c, h}, {h, c}} {
				if _, err := p[0].Write([]byte("ping")); err != nil {
					t.Fatal(err)
				}
				_ = p[1].SetReadDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 4)
				if _, err := io.ReadFull(p[1], buf); err != nil || string(buf) != "ping" {
					t.Fatalf("read %q, %v", buf, err)
				}
			}
			h.Close()
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
				t.Fatalf("after the host closed, the command read %d, %v", n, err)
			}
		})
	}
}

// TestHandoffWire: init and the host name the same handoff bytes.
func TestHandoffWire(t *testing.T) {
	if handoffMarker != hostchannel.HandoffMarker || streamMarker != hostchannel.StreamMarker ||
		handoffTaken != hostchannel.HandoffTaken || handoffStream != hostchannel.HandoffStream ||
		egressSocketName != hostchannel.EgressSocketName {
		t.Fatal("cmd/sandkeep-agent and internal/channel disagree on the egress handoff's wire")
	}
}
