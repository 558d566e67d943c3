package main

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/testutil/kubetest"
)

// TestServeRestartKube runs the real `sandkeep serve` on the kubernetes driver (the cloud host kind, no flag):
// a command in a run, serve restarted, the same run goes on in the same pod with its workspace and over the
// pod's agent channel again; then the pod is deleted behind serve's back, and the next command of the run gets
// a new pod with the workspace intact (the claim). The run is one row throughout and its events continue.
func TestServeRestartKube(t *testing.T) {
	if !kubetest.Selected() {
		t.Skipf("a kubernetes test: scripts/test.sh's kubernetes stage runs it (%s=%s)", kubetest.EnvDriver, kubetest.Driver)
	}
	t.Parallel()
	c := newCLI(t)
	// The channel's address is the operator's (a Service or the pod IP and a fixed port in a cluster): both
	// processes listen on it, so the pods' agents find the new one.
	ln, err := net.Listen("tcp", kubetest.NodeHostIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	env := []string{kube.EnvChannelListen + "=" + addr}

	tenant := c.ten("acme")
	tok := c.createToken(t, tenant, "restart", "admin")
	s1 := c.startServerEnv(t, env)
	cl := s1.client(t, tok.Token)
	run, err := cl.StartRun(bounded(t), "alice", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if run.Driver != kubetest.Driver {
		t.Fatalf("run admitted on driver %q, want %s (the cloud host kind, no flag)", run.Driver, kubetest.Driver)
	}
	exec := func(cl *client.Client, command string) *client.ExecResult {
		t.Helper()
		res, err := cl.Exec(bounded(t), "alice", client.ExecRequest{Command: command, RunID: run.ID, Timeout: time.Minute})
		if err != nil {
			t.Fatalf("exec %q: %v", command, err)
		}
		if res.ExitCode != 0 {
			t.Fatalf("exec %q: %+v", command, res)
		}
		return res
	}
	first := exec(cl, "echo kept > /workspace/f")
	pod := c.pod(t, first.Sandbox.Name)

	// Restart: SIGTERM, then a new process over the same home and channel address.
	if err := s1.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s1.exited:
	case <-time.After(processBound):
		t.Fatal("sandkeep serve did not stop on SIGTERM")
	}
	s2 := c.startServerEnv(t, env)
	cl = s2.client(t, tok.Token)
	second := exec(cl, "cat /workspace/f")
	if strings.TrimSpace(second.Stdout) != "kept" || second.Sandbox.ID != first.Sandbox.ID {
		t.Errorf("after the restart: sandbox %s (want %s), file %q", second.Sandbox.ID, first.Sandbox.ID, second.Stdout)
	}
	if again := c.pod(t, first.Sandbox.Name); again.UID != pod.UID {
		t.Errorf("after the restart the pod is %s, want the one serve made (%s) adopted", again.UID, pod.UID)
	}
	// The adopted pod's agent dials the new process: commands go over the channel again, and say so.
	overChannel := false
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if exec(cl, "true").Transport == "agent" {
			overChannel = true
			break
		}
	}
	if !overChannel {
		t.Errorf("no command went over the agent channel within a minute of the restart (transport stayed exec)")
	}

	// The pod deleted behind serve's back: the next command makes a new one, on the same claim.
	zero := int64(0)
	pods := c.kc.API.CoreV1().Pods(c.ns)
	if err := pods.Delete(bounded(t), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	for {
		got, err := pods.Get(bounded(t), pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && got.UID != pod.UID) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	third := exec(cl, "cat /workspace/f")
	if strings.TrimSpace(third.Stdout) != "kept" {
		t.Errorf("after the pod was deleted: file %q, want the workspace intact", third.Stdout)
	}
	if again := c.pod(t, first.Sandbox.Name); again.UID == pod.UID {
		t.Errorf("the deleted pod %s is still the one running", pod.UID)
	}

	// One run throughout, its events in order across both processes.
	finished, err := cl.FinishRun(bounded(t), run.ID, false)
	if err != nil || finished.Status != "succeeded" {
		t.Fatalf("finish the run: %+v, %v", finished, err)
	}
	runs, err := cl.Runs(bounded(t), client.RunFilter{User: "alice"})
	if err != nil || len(runs) != 1 || runs[0].ID != run.ID {
		t.Fatalf("runs of alice: %+v, %v; want the one run", runs, err)
	}
	evs, err := cl.Events(bounded(t), run.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	transports := map[string]int{}
	for i, ev := range evs {
		if i > 0 && ev.Seq <= evs[i-1].Seq {
			t.Errorf("event %d: seq %d after %d", i, ev.Seq, evs[i-1].Seq)
		}
		names = append(names, ev.Name)
		if ev.Name == events.NameExecFinished {
			var p events.ExecFinished
			if err := json.Unmarshal(ev.Payload, &p); err != nil {
				t.Fatal(err)
			}
			transports[p.Transport]++
		}
	}
	// Started (created) by the first process; the second reuses the running pod as is (no start); started again
	// (a new pod of the same sandbox) after the deletion.
	want := []string{events.NameSandboxStarted, events.NameExecFinished, events.NameExecFinished,
		events.NameSandboxStarted, events.NameExecFinished}
	if !subsequence(names, want) {
		t.Errorf("the run's events %q do not contain %q in order", names, want)
	}
	if n := count(names, events.NameSandboxStarted); n != 2 {
		t.Errorf("the run's events %q: %d sandbox_started, want 2 (the first pod, the one after the deletion)", names, n)
	}
	if n := count(names, events.NameExecFinished); n < 4 {
		t.Errorf("the run's events %q: %d exec_finished, want one per command (at least 4)", names, n)
	}
	if overChannel && transports["agent"] == 0 {
		t.Errorf("exec_finished transports %v: a command that went over the channel is recorded as exec", transports)
	}
}

// subsequence reports whether want appears in got in order (not necessarily adjacent).
func subsequence(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

func count(list []string, s string) int {
	n := 0
	for _, v := range list {
		if v == s {
			n++
		}
	}
	return n
}

// pod is the sandbox's pod named name in the cli's namespace.
func (c *cli) pod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := c.kc.API.CoreV1().Pods(c.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("pod %s: %v", name, err)
	}
	return p
}
