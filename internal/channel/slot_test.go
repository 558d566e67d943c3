package channel

import (
	"errors"
	"net"
	"testing"
	"time"
)

// TestSlotOneConnection: the session side every acceptor installs into keeps the first live connection and
// refuses a second while it is up; Drop ends the current one and takes the next; Close wakes a waiter at once.
func TestSlotOneConnection(t *testing.T) {
	s := NewSlot()
	a, aPeer := net.Pipe()
	defer aPeer.Close()
	if !s.Install(a) || !s.Up() {
		t.Fatal("the first connection was not installed")
	}
	b, bPeer := net.Pipe()
	defer bPeer.Close()
	if s.Install(b) {
		t.Fatal("a second connection was installed while the first is up")
	}
	first, err := s.Current(t.Context(), time.Second)
	if err != nil {
		t.Fatal(err)
	}

	s.Drop()
	if s.Up() {
		t.Fatal("up after Drop")
	}
	c, cPeer := net.Pipe()
	defer cPeer.Close()
	if !s.Install(c) {
		t.Fatal("the next connection after Drop was not installed")
	}
	if next, err := s.Current(t.Context(), time.Second); err != nil || next == first {
		t.Fatalf("Current after a new connection = %p, %v; want a new one", next, err)
	}

	done := make(chan error, 1)
	s.Drop()
	go func() {
		_, err := s.Take(t.Context(), time.Minute)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	s.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrNoChannel) {
			t.Fatalf("a waiter on a closed slot got %v, want ErrNoChannel", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the waiter")
	}
	d, dPeer := net.Pipe()
	defer dPeer.Close()
	if s.Install(d) {
		t.Fatal("a closed slot installed a connection")
	}
}
