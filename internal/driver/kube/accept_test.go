package kube

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// TestSilentHellosDoNotStall: 64 connections that never say hello, from one address (a sandbox's command shares
// its pod's IP), do not hold up another pod's hello: it is answered (here refused: the pod is unknown) at once,
// while the silent ones are still within their hello wait. Before issue 22's fix Accept blocked on 64 hello
// slots, so the next hello waited out the whole hello wait (a refusal answered in 0.4 ms took 4.9 s).
func TestSilentHellosDoNotStall(t *testing.T) {
	s, err := listenChannel("127.0.0.1:0", "", kubefake.NewClientset(), "sandkeep-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.close() })
	addr := s.ln.Addr().String()

	silent := make([]net.Conn, 0, 64)
	for range 64 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	t.Cleanup(func() {
		for _, c := range silent {
			c.Close()
		}
	})
	waited := time.Now()

	// Another pod, another address (127.0.0.2 is loopback too).
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hello, err := agentproto.AppendHello(nil, agentproto.Hello{Name: "other-pod", Token: make([]byte, agentproto.MinHelloToken)})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Write(hello); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * helloWait))
	_, err = c.Read(make([]byte, 1))
	answered := time.Since(start)
	if !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("the other pod's hello: %v after %s, want it closed (refused)", err, answered)
	}
	t.Logf("the other pod's hello answered in %s with 64 silent connections open", answered)
	// Answered well within the hello wait the silent connections are held to: it waited for none of them (the
	// issue's bar is 100 ms; measured here about 1 ms, logged above, and only the wait is asserted so that a
	// loaded machine does not fail it).
	if answered >= helloWait/2 {
		t.Errorf("the other pod's hello was answered %s after it was sent (%s after the silent connections opened): it waited for their hello wait (%s)",
			answered, time.Since(waited), helloWait)
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}
