package kube

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
)

// TestAcceptorInstallsInSlot: the pod network's acceptor installs a believed connection in the pod's
// channel.Slot, the session side the Docker channel uses, and the slot carries the multiplexed wire over it (a
// command's request goes out as a request frame, and a concurrent command beside it on a route of its own). A
// wrong token is refused; while the agent's connection is up a second one with the right hello is refused; once
// it is gone the next one is installed. No node: a fake API server's pod, dialled from 127.0.0.1.
func TestAcceptorInstallsInSlot(t *testing.T) {
	const ns, name, owner = "sandkeep-test", "sandkeep-u-slot", types.UID("rec-uid-1")
	token := strings.Repeat("t", agentproto.MinHelloToken)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{LabelManagedBy: ManagedBy},
			OwnerReferences: []metav1.OwnerReference{{Kind: "ConfigMap", Name: name, UID: owner}}},
		Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Name: InitName,
			Env: []corev1.EnvVar{{Name: TokenEnv, Value: token}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"},
	}
	s, err := listenChannel("127.0.0.1:0", "", kubefake.NewClientset(pod), ns, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.close() })
	d := &Driver{ch: s}
	slot := d.AgentChannel(&driver.Sandbox{Name: name, ID: string(owner)})
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		_, known := s.trust[name]
		s.mu.Unlock()
		if known {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the informer never saw the pod")
		}
		time.Sleep(10 * time.Millisecond)
	}

	dial := func(tok string) net.Conn {
		t.Helper()
		c, err := net.DialTimeout("tcp", s.ln.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		hello, err := agentproto.AppendHello(nil, agentproto.Hello{Name: name, Token: []byte(tok)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(hello); err != nil {
			t.Fatal(err)
		}
		return c
	}
	waitRefused := func(want int) {
		t.Helper()
		for s.snapshot().Refused < want {
			if time.Now().After(deadline) {
				t.Fatalf("refused %d connections, want %d", s.snapshot().Refused, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	deadline = time.Now().Add(10 * time.Second)

	dial(strings.Repeat("f", agentproto.MinHelloToken))
	waitRefused(1)
	if _, err := slot.Take(t.Context(), 100*time.Millisecond); err == nil {
		t.Fatal("a connection with a wrong token was installed")
	}

	agent := dial(token)
	mux, err := slot.Take(t.Context(), 5*time.Second)
	if err != nil {
		t.Fatalf("the pod's agent was not installed: %v", err)
	}
	if got := d.AgentChannel(&driver.Sandbox{Name: name, ID: string(owner)}); got != slot {
		t.Fatal("AgentChannel gave another slot for the same sandbox")
	}

	// The wire after the hello is the multiplexed one: the exclusive command's request and a concurrent one's.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		_, _ = agentproto.RunWith(ctx, mux.Commands(), agentproto.Request{Version: agentproto.Version, ID: 1, Argv: []string{"true"},
			Workdir: driver.WorkspaceDir, TimeoutMS: 1000, StdoutLimit: 1, StderrLimit: 1}, nil, nil, nil, agentproto.RunOptions{})
	}()
	route := mux.Route(7)
	defer route.Close()
	go func() {
		_, _ = agentproto.RunWith(ctx, route, agentproto.Request{Version: agentproto.Version, ID: 7, Argv: []string{"true"},
			Workdir: driver.WorkspaceDir, TimeoutMS: 1000, StdoutLimit: 1, StderrLimit: 1, Concurrent: true}, nil, nil, nil, agentproto.RunOptions{})
	}()
	_ = agent.SetReadDeadline(time.Now().Add(5 * time.Second))
	ids := map[uint32]bool{}
	var buf []byte
	for len(ids) < 2 {
		f, err := agentproto.ReadFrame(agent, &buf)
		if err != nil {
			t.Fatalf("the agent's end read %v after requests %v", err, ids)
		}
		if f.Type != agentproto.FrameRequest {
			t.Fatalf("frame %c, want a request", f.Type)
		}
		ids[f.ID] = true
	}
	if !ids[1] || !ids[7] {
		t.Fatalf("requests %v, want 1 and 7", ids)
	}

	// One connection at a time: the right hello again, while the agent's is up, is refused.
	refused := s.snapshot().Refused
	dial(token)
	waitRefused(refused + 1)
	cancel()

	// Once its end is closed and the mux has seen it (until then a hello is refused as a second connection, and a
	// real agent redials), the agent's next connection is installed.
	agent.Close()
	deadline = time.Now().Add(10 * time.Second)
	for mux.Alive() {
		if time.Now().After(deadline) {
			t.Fatal("the mux never saw its connection closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	next := dial(token)
	mux2, err := slot.Current(t.Context(), 5*time.Second)
	for err == nil && mux2 == mux {
		time.Sleep(10 * time.Millisecond)
		mux2, err = slot.Current(t.Context(), 5*time.Second)
	}
	if err != nil {
		t.Fatalf("the agent's next connection was not installed: %v", err)
	}
	_ = next
	if st := s.snapshot(); st.Accepted != 2 {
		t.Errorf("accepted %d connections, want 2", st.Accepted)
	}

	// Removing the sandbox closes its slot.
	s.forget(name, true)
	if _, err := slot.Current(t.Context(), 100*time.Millisecond); err == nil {
		t.Error("the removed sandbox's slot still hands out a connection")
	}
}
