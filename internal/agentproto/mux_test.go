package agentproto

import (
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

// muxPair returns a Mux over the host end of a Unix connection, and the agent's end.
func muxPair(t *testing.T) (*Mux, net.Conn) {
	t.Helper()
	ln, err := net.Listen("unix", t.TempDir()+"/s")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	agent, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	host, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	m := NewMux(host.(*net.UnixConn))
	t.Cleanup(func() { m.Close(); agent.Close() })
	return m, agent
}

// openAccepted dials a stream and answers the open as an agent that connected.
func openAccepted(t *testing.T, m *Mux, agent net.Conn) (*Stream, uint32) {
	t.Helper()
	type dialed struct {
		s   *Stream
		err error
	}
	got := make(chan dialed, 1)
	go func() {
		s, err := m.Dial(t.Context(), netip.MustParseAddrPort("127.0.0.1:8080"))
		got <- dialed{s, err}
	}()
	var buf []byte
	f, err := ReadFrame(agent, &buf)
	if err != nil || f.Type != FrameForwardOpen {
		t.Fatalf("agent read %v %v, want an open", f.Type, err)
	}
	if err := WriteFrame(agent, FrameForwardReply, f.ID, EncodeForwardReply(ForwardOK, "")); err != nil {
		t.Fatal(err)
	}
	d := <-got
	if d.err != nil {
		t.Fatal(d.err)
	}
	return d.s, f.ID
}

// TestMuxWindowOverrun: an agent that sends more than the window it was granted breaks the channel: the stream
// reads what fitted, then an error wrapping ErrProtocol, and the Mux is dead.
func TestMuxWindowOverrun(t *testing.T) {
	m, agent := muxPair(t)
	s, id := openAccepted(t, m, agent)
	chunk := make([]byte, ForwardChunk)
	for range ForwardWindow/ForwardChunk + 1 {
		if err := WriteFrame(agent, FrameForwardData, id, chunk); err != nil {
			break
		}
	}
	select {
	case <-m.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the Mux kept a channel whose agent overran the window")
	}
	n := 0
	buf := make([]byte, 64<<10)
	for {
		k, err := s.Read(buf)
		n += k
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("read after the overrun: %v, want ErrProtocol", err)
			}
			break
		}
	}
	if n > ForwardWindow {
		t.Fatalf("the stream held %d bytes, more than the window", n)
	}
	if m.Idle() {
		t.Fatal("a dead Mux reports idle")
	}
}

// TestMuxIdle: a command frame the agent sends between commands makes the channel not idle (Take drops it); a
// forward frame does not.
func TestMuxIdle(t *testing.T) {
	m, agent := muxPair(t)
	_, id := openAccepted(t, m, agent)
	if err := WriteFrame(agent, FrameForwardData, id, []byte("x")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if !m.Idle() {
		t.Fatal("forward data made the channel look busy")
	}
	if _, err := agent.Write([]byte{byte(FrameStdout), 0}); err != nil { // half a header
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for m.Idle() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if m.Idle() {
		t.Fatal("a command frame's first bytes while idle left the channel idle")
	}
}

// TestMuxIdleAfterResult: once a command has its result the channel is idle at once, also while the Mux's reader
// has not yet noted that it queued that result (the next command of the same user may come that fast). The
// channel used to look busy in that moment, and the next command's Take dropped it, ending the sandbox's
// processes with it (TestProcessBesideCommands failed about one run in four under -race).
func TestMuxIdleAfterResult(t *testing.T) {
	queued := make(chan struct{})
	release := make(chan struct{})
	afterQueued = func(f Frame) {
		if f.Type == FrameResult {
			close(queued)
			<-release // hold the reader in the moment between queueing the result and noting it
		}
	}
	m, agent := muxPair(t)
	t.Cleanup(func() { afterQueued = nil }) // after muxPair's cleanup has ended the reader (cleanups run last first)
	go func() {
		var buf []byte
		f, err := ReadFrame(agent, &buf)
		if err != nil {
			return
		}
		_ = WriteFrame(agent, FrameAccepted, f.ID, nil)
		_ = WriteFrame(agent, FrameStdout, f.ID, []byte("hi\n"))
		body, _ := json.Marshal(Result{ID: f.ID})
		_ = WriteFrame(agent, FrameResult, f.ID, body)
	}()
	res, err := RunWith(t.Context(), m.Commands(), testRequest(3), nil, nil, nil, RunOptions{AcceptWait: 5 * time.Second})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("run: %+v %v", res, err)
	}
	<-queued
	idle := m.Idle()
	close(release)
	if !idle {
		t.Fatal("the channel looked busy right after its command's result: the next command would drop it")
	}
	// A frame for nobody that arrives while idle still makes it busy.
	if err := WriteFrame(agent, FrameStdout, 9, []byte("stray")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for m.Idle() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if m.Idle() {
		t.Fatal("a stray command frame left the channel idle")
	}
}
