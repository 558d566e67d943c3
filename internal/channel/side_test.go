package channel

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSideListener: Accept hands out only connections from the verified pid; any other peer is closed at once;
// a second listener on the same live socket is refused; Close removes the socket file.
func TestSideListener(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "chan")
	allowed := make(chan int, 1)
	l, err := ListenSide(dir, EgressSocketName, func(pid int) bool {
		select {
		case want := <-allowed:
			return pid == want
		default:
			return false
		}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()

	// Not verified: closed by the listener, never accepted.
	c, err := Dial(filepath.Join(dir, EgressSocketName), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("an unverified peer's connection stayed open: %d, %v", n, err)
	}
	c.Close()
	select {
	case c := <-accepted:
		t.Fatalf("an unverified connection was accepted: %v", c)
	default:
	}

	// Verified: accepted.
	allowed <- os.Getpid()
	c, err = Dial(filepath.Join(dir, EgressSocketName), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case got := <-accepted:
		got.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the verified connection was not accepted")
	}

	if _, err := ListenSide(dir, EgressSocketName, nil, nil); err != ErrInUse {
		t.Errorf("a second listener on a live socket: %v, want ErrInUse", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, EgressSocketName)); !os.IsNotExist(err) {
		t.Errorf("the socket file is still there after Close: %v", err)
	}
}
