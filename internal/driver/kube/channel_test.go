package kube_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// TestChannel: commands go over the pod's agent channel, the token is nowhere a command can read it, and only
// the pod's agent is believed: a command in the pod that dials the server with a forged hello is refused, and
// so is the pod's real token from another address; the channel keeps serving afterwards.
func TestChannel(t *testing.T) {
	c := theNode(t)
	ns := c.namespace(t)
	d := c.driver(t, ns)
	c.recordPods(t, ns, checkRestricted)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	key, err := identity.New("acme", "channel")
	if err != nil {
		t.Fatal(err)
	}
	sb := createStarted(t, ctx, d, c.spec(t, ns, key, "inst-channel-"+randHex(t, 3)))

	if r, via := runVia(t, ctx, d, sb, "sh", "-c", "echo hi; exit 7"); r.exit != 7 || r.stdout != "hi\n" || !via {
		t.Fatalf("first command = %+v (over the channel: %v); want exit 7, hi, over the channel", r, via)
	}

	// The token: gone from its file, absent from PID 1's environment and memory (not dumpable), and not in the
	// sandbox container's environment at all.
	if r := run(t, ctx, d, sb, "sh", "-c", "ls -A "+kube.TokenDir+"; cat "+kube.TokenFile); r.exit == 0 || strings.TrimSpace(r.stdout) != "" {
		t.Errorf("the token file is readable or still there: %+v", r)
	}
	if r := run(t, ctx, d, sb, "cat", "/proc/1/environ"); r.exit == 0 {
		t.Errorf("a command read PID 1's environment: %+v", r)
	}
	if r := run(t, ctx, d, sb, "sh", "-c", "env | grep -c "+kube.TokenEnv); strings.TrimSpace(r.stdout) != "0" {
		t.Errorf("the token variable is in the sandbox's environment: %+v", r)
	}

	pod, err := c.api.CoreV1().Pods(ns).Get(ctx, sb.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var token string
	for _, e := range pod.Spec.InitContainers[0].Env {
		if e.Name == kube.TokenEnv {
			token = e.Value
		}
	}
	if len(token) < agentproto.MinHelloToken {
		t.Fatalf("the pod's init container has no token: %+v", pod.Spec.InitContainers[0].Env)
	}

	// A command in the pod dials the server and says it is the pod's agent, with a made-up token.
	refused := d.ChannelStats().Refused
	forged, err := agentproto.AppendHello(nil, agentproto.Hello{Name: sb.Name, Token: []byte(strings.Repeat("f", 64))})
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(d.ChannelAddr())
	script := fmt.Sprintf("printf '%s' > /tmp/hello; (cat /tmp/hello; sleep 2) | nc %s %s; echo nc=$?", octal(forged), host, port)
	if r := run(t, ctx, d, sb, "sh", "-c", script); r.exit != 0 {
		t.Fatalf("the forging command: %+v", r)
	}
	waitRefused(t, d, refused+1)

	// The real token from another address (this test process, on the host) is refused too.
	refused = d.ChannelStats().Refused
	real, err := agentproto.AppendHello(nil, agentproto.Hello{Name: sb.Name, Token: []byte(token)})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", d.ChannelAddr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(real); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); err == nil {
		t.Errorf("the server answered a hello from the wrong address (%d bytes)", n)
	}
	conn.Close()
	waitRefused(t, d, refused+1)

	// The agent's channel still serves, with exact statuses and bounds.
	req := request("sh", "-c", "head -c 5000 /dev/zero | tr '\\0' x; exit 3")
	req.StdoutLimit = 100
	var out strings.Builder
	res, via, err := execVia(ctx, d, sb, req, driver.Output{Stdout: &out})
	if err != nil || res.ExitCode != 3 || !res.StdoutTruncated || out.Len() > 100 {
		t.Fatalf("bounded command = %+v (%d bytes), %v; want exit 3, truncated at 100", res, out.Len(), err)
	}
	if !via {
		t.Errorf("the command after the refusals did not go over the channel")
	}
}

// TestChannelFallback: a driver without the channel runs every command through the API server's exec.
func TestChannelFallback(t *testing.T) {
	c := theNode(t)
	ns := c.namespace(t)
	d := c.driverExec(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	key, err := identity.New("acme", "fallback")
	if err != nil {
		t.Fatal(err)
	}
	sb := createStarted(t, ctx, d, c.spec(t, ns, key, "inst-fallback-"+randHex(t, 3)))
	if r := run(t, ctx, d, sb, "sh", "-c", "echo via exec; exit 4"); r.exit != 4 || r.stdout != "via exec\n" {
		t.Fatalf("exec without a channel = %+v", r)
	}
	if st := d.ChannelStats(); st != (kube.ChannelStats{}) {
		t.Errorf("a driver without a channel counted %+v", st)
	}
}

func waitRefused(t *testing.T, d *kube.Driver, want int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for d.ChannelStats().Refused < want {
		if time.Now().After(deadline) {
			t.Fatalf("refusals = %d; want %d", d.ChannelStats().Refused, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// octal writes b as printf(1) octal escapes.
func octal(b []byte) string {
	var s strings.Builder
	for _, c := range b {
		fmt.Fprintf(&s, "\\%03o", c)
	}
	return s.String()
}

// TestChannelAdoption: a server restart (a new driver on the same channel address) adopts the pods the last
// one made: it lists them by installation, their agents dial it, and commands go over the channel again with
// the workspace as it was; a pod deleted behind its back is stopped, and started again with the workspace.
func TestChannelAdoption(t *testing.T) {
	c := theNode(t)
	ns := c.namespace(t)
	first := c.driver(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	key, err := identity.New("acme", "adopt")
	if err != nil {
		t.Fatal(err)
	}
	installation := "inst-adopt-" + randHex(t, 3)
	sb := createStarted(t, ctx, first, c.spec(t, ns, key, installation))
	if r := run(t, ctx, first, sb, "sh", "-c", "echo kept > state.txt"); r.exit != 0 {
		t.Fatalf("write: %+v", r)
	}
	addr := first.ChannelAddr()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	second := c.newDriver(t, kube.Options{Namespace: ns, ChannelListen: addr})
	list, err := second.List(ctx, installation)
	if err != nil || len(list) != 1 || list[0].ID != sb.ID || list[0].State != driver.StateRunning {
		t.Fatalf("the restarted driver lists %+v, %v; want the running sandbox %s", list, err, sb.ID)
	}
	deadline := time.Now().Add(30 * time.Second)
	for second.ChannelStats().Accepted == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the pod's agent did not dial the restarted server: %+v", second.ChannelStats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r, via := runVia(t, ctx, second, list[0], "cat", "state.txt"); r.stdout != "kept\n" || !via {
		t.Fatalf("after the restart: %+v (over the channel: %v); want kept, over the channel", r, via)
	}

	if err := c.api.CoreV1().Pods(ns).Delete(ctx, sb.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitState(t, ctx, second, sb.Name, driver.StateStopped)
	if _, err := second.Exec(ctx, list[0], request("true"), driver.Output{}); !cerrdefs.IsConflict(err) {
		t.Fatalf("Exec with the pod deleted behind the driver's back = %v; want errdefs.ErrConflict", err)
	}
	if err := second.Start(ctx, list[0]); err != nil {
		t.Fatal(err)
	}
	if r, via := runVia(t, ctx, second, list[0], "cat", "state.txt"); r.stdout != "kept\n" || !via {
		t.Fatalf("after the pod was recreated: %+v (over the channel: %v); want kept, over the channel", r, via)
	}
}
