//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// muxAgent is one `sandkeep-agent serve` on a socket pair, read through a Mux as the host reads a channel, so
// that commands, processes and operations run on it at once.
type muxAgent struct {
	mux    *agentproto.Mux
	cmd    *exec.Cmd
	nextID atomic.Uint32
}

func startMuxAgent(t *testing.T) *muxAgent {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	host, agent := os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "agent")
	cmd := exec.Command(agentBin, "serve")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = agent, agent, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	agent.Close()
	c, err := net.FileConn(host)
	host.Close()
	if err != nil {
		t.Fatal(err)
	}
	a := &muxAgent{mux: agentproto.NewMux(c.(*net.UnixConn)), cmd: cmd}
	t.Cleanup(func() { a.stop(t) })
	return a
}

// stop hangs up, as a host that goes away does, and waits for the agent.
func (a *muxAgent) stop(t *testing.T) {
	if a.cmd.ProcessState != nil {
		return
	}
	a.mux.Close()
	if err := a.cmd.Wait(); err != nil {
		t.Errorf("agent exit: %v", err)
	}
}

func (a *muxAgent) request(argv ...string) agentproto.Request {
	return agentproto.Request{
		Version: agentproto.Version, ID: a.nextID.Add(1), Argv: argv, TimeoutMS: 30_000, GraceMS: 300,
		StdoutLimit: agentproto.DefaultLimit, StderrLimit: agentproto.DefaultLimit,
	}
}

// run runs req on a route of its own.
func (a *muxAgent) run(ctx context.Context, req agentproto.Request) (agentproto.Result, string, string, error) {
	conn := a.mux.Route(req.ID)
	defer conn.Close()
	var out, errb bytes.Buffer
	res, err := agentproto.Run(ctx, conn, req, &out, &errb, nil)
	return res, out.String(), errb.String(), err
}

func (a *muxAgent) start(t *testing.T, tag string, timeoutMS int64, stdin bool, argv ...string) int {
	t.Helper()
	req := a.request(argv...)
	req.Detach = &agentproto.Detach{Tag: tag}
	req.TimeoutMS, req.Stdin = timeoutMS, stdin
	conn := a.mux.Route(req.ID)
	defer conn.Close()
	var errb bytes.Buffer
	res, err := agentproto.Run(t.Context(), conn, req, nil, &errb, strings.NewReader(""))
	if err != nil || res.PID <= 0 {
		t.Fatalf("start %v: %+v %v %q", argv, res, err, errb.String())
	}
	return res.PID
}

func (a *muxAgent) op(ctx context.Context, op agentproto.ProcessOp, stdout, stderr *bytes.Buffer) (agentproto.ProcessReply, error) {
	op.Version, op.ID = agentproto.Version, a.nextID.Add(1)
	conn := a.mux.Route(op.ID)
	defer conn.Close()
	var o, e *bytes.Buffer = stdout, stderr
	if o == nil {
		o = &bytes.Buffer{}
	}
	if e == nil {
		e = &bytes.Buffer{}
	}
	return agentproto.ProcessCall(ctx, conn, op, o, e)
}

func (a *muxAgent) info(t *testing.T, pid int) agentproto.ProcessInfo {
	t.Helper()
	rep, err := a.op(t.Context(), agentproto.ProcessOp{Op: agentproto.OpList}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Processes {
		if p.PID == pid {
			return p
		}
	}
	t.Fatalf("pid %d not listed in %+v", pid, rep.Processes)
	return agentproto.ProcessInfo{}
}

// TestProcessOutlivesCommands: a process keeps running while commands run and end beside it (their tree kill
// leaves it alone); attach replays its output and follows it; a signal ends it with the exit status it caused.
func TestProcessOutlivesCommands(t *testing.T) {
	t.Parallel()
	a := startMuxAgent(t)
	pid := a.start(t, "srv", 30_000, false, "sh", "-c", "echo ready; trap 'echo bye; exit 3' TERM; while :; do sleep 0.05; done")
	for i := range 3 {
		res, out, _, err := a.run(t.Context(), a.request("sh", "-c", fmt.Sprintf("sleep 60 & echo %d", i)))
		if err != nil || res.ExitCode != 0 || out != fmt.Sprintf("%d\n", i) {
			t.Fatalf("command %d beside the process: %+v %q %v", i, res, out, err)
		}
	}
	if in := a.info(t, pid); !in.Running || in.Tag != "srv" || in.Argv[0] != "sh" {
		t.Fatalf("after commands: %+v", in)
	}
	var out bytes.Buffer
	attached := make(chan agentproto.ProcessReply, 1)
	go func() {
		rep, err := a.op(context.Background(), agentproto.ProcessOp{Op: agentproto.OpAttach, Tag: "srv", Replay: true}, &out, nil)
		if err != nil {
			t.Error(err)
		}
		attached <- rep
	}()
	time.Sleep(200 * time.Millisecond)
	if rep, err := a.op(t.Context(), agentproto.ProcessOp{Op: agentproto.OpSignal, PID: pid, Signal: int(syscall.SIGTERM)}, nil, nil); err != nil || rep.Code != "" {
		t.Fatalf("signal: %+v %v", rep, err)
	}
	rep := <-attached
	if len(rep.Processes) != 1 || rep.Processes[0].Exit == nil || rep.Processes[0].Exit.ExitCode != 3 || out.String() != "ready\nbye\n" {
		t.Fatalf("attach: %+v %q", rep, out.String())
	}
	if rep, _ := a.op(t.Context(), agentproto.ProcessOp{Op: agentproto.OpSignal, PID: pid, Signal: 9}, nil, nil); rep.Code != agentproto.ReplyExited {
		t.Fatalf("signal to an exited process: %+v", rep)
	}
	if rep, _ := a.op(t.Context(), agentproto.ProcessOp{Op: agentproto.OpKill, Tag: "nope"}, nil, nil); rep.Code != agentproto.ReplyNotFound {
		t.Fatalf("unknown tag: %+v", rep)
	}
}

// TestProcessInput: input reaches the process's stdin; closing it ends a cat.
func TestProcessInput(t *testing.T) {
	t.Parallel()
	a := startMuxAgent(t)
	pid := a.start(t, "", 30_000, true, "cat")
	if rep, err := a.op(t.Context(), agentproto.ProcessOp{Op: agentproto.OpInput, PID: pid, Data: []byte("hello\n")}, nil, nil); err != nil || rep.Code != "" {
		t.Fatalf("input: %+v %v", rep, err)
	}
	if rep, err := a.op(t.Context(), agentproto.ProcessOp{Op: agentproto.OpCloseStdin, PID: pid}, nil, nil); err != nil || rep.Code != "" {
		t.Fatalf("close stdin: %+v %v", rep, err)
	}
	var out bytes.Buffer
	rep, err := a.op(t.Context(), agentproto.ProcessOp{Op: agentproto.OpAttach, PID: pid, Replay: true}, &out, nil)
	if err != nil || rep.Processes[0].Exit == nil || rep.Processes[0].Exit.ExitCode != 0 || out.String() != "hello\n" {
		t.Fatalf("attach: %+v %q %v", rep, out.String(), err)
	}
}

// TestProcessLifetimeAndKill: past its lifetime bound a process's whole tree is killed (TimedOut); OpKill kills
// the tree at once (Cancelled); an attach the host cancels leaves the process running.
func TestProcessLifetimeAndKill(t *testing.T) {
	t.Parallel()
	a := startMuxAgent(t)
	const marker = 999201
	bounded := a.start(t, "", 1000, false, "sh", "-c", fmt.Sprintf(escapees, marker)+"wait")
	killed := a.start(t, "k", 30_000, false, "sleep", "60")
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	rep, err := a.op(ctx, agentproto.ProcessOp{Op: agentproto.OpAttach, PID: killed}, nil, nil)
	if err == nil || !rep.Detached || !rep.Processes[0].Running {
		t.Fatalf("cancelled attach: %+v %v", rep, err)
	}
	if rep, err := a.op(t.Context(), agentproto.ProcessOp{Op: agentproto.OpKill, Tag: "k"}, nil, nil); err != nil || rep.Code != "" {
		t.Fatalf("kill: %+v %v", rep, err)
	}
	var out bytes.Buffer
	rep, err = a.op(t.Context(), agentproto.ProcessOp{Op: agentproto.OpAttach, PID: bounded, Replay: true}, &out, nil)
	if err != nil || rep.Processes[0].Exit == nil || !rep.Processes[0].Exit.TimedOut {
		t.Fatalf("bounded: %+v %v", rep, err)
	}
	checkGone(t, pidsOf(t, out.String()), marker)
	rep, err = a.op(t.Context(), agentproto.ProcessOp{Op: agentproto.OpAttach, PID: killed}, nil, nil)
	if err != nil || rep.Processes[0].Exit == nil || !rep.Processes[0].Exit.Cancelled {
		t.Fatalf("killed: %+v %v", rep, err)
	}
}

// TestProcessRingBound: a flood keeps only the ring's bytes; an attach says how many it lost.
func TestProcessRingBound(t *testing.T) {
	t.Parallel()
	a := startMuxAgent(t)
	req := a.request("sh", "-c", "head -c 20000000 /dev/zero; echo; echo end")
	req.Detach = &agentproto.Detach{Ring: 64 << 10}
	conn := a.mux.Route(req.ID)
	res, err := agentproto.Run(t.Context(), conn, req, nil, nil, nil)
	conn.Close()
	if err != nil || res.PID <= 0 {
		t.Fatalf("start: %+v %v", res, err)
	}
	// Wait for the end without output (a live attach would keep up with the flood), then replay the ring.
	if rep, err := a.op(t.Context(), agentproto.ProcessOp{Op: agentproto.OpAttach, PID: res.PID, Quiet: true}, nil, nil); err != nil || rep.Processes[0].Exit == nil {
		t.Fatalf("wait: %+v %v", rep, err)
	}
	var out bytes.Buffer
	rep, err := a.op(t.Context(), agentproto.ProcessOp{Op: agentproto.OpAttach, PID: res.PID, Replay: true}, &out, nil)
	if err != nil || rep.Processes[0].Exit == nil {
		t.Fatalf("attach: %+v %v", rep, err)
	}
	if out.Len() != 64<<10 || !strings.HasSuffix(out.String(), "\nend\n") || rep.Processes[0].StdoutDropped != 20000005-64<<10 {
		t.Fatalf("replayed %d bytes (dropped %d), want the last %d", out.Len(), rep.Processes[0].StdoutDropped, 64<<10)
	}
}

// TestConcurrentCommands: commands run at once, each with its own tree: one's end kills its own leftovers, not
// the other's.
func TestConcurrentCommands(t *testing.T) {
	t.Parallel()
	a := startMuxAgent(t)
	const marker = 999212
	// A rendezvous, not a clock (a loaded machine made a 900 ms bound flaky): each command waits for a file the
	// other writes, so commands run one after the other never finish (the requests' 30 s deadline fails them),
	// and slow checks its own leftover only after fast ended and its leftovers were killed.
	dir := t.TempDir()
	slow := a.request("sh", "-c", fmt.Sprintf("sleep %d & echo $!; touch %s/slow; until [ -e %s/fastdone ]; do sleep 0.01; done; kill -0 $! && echo alive", marker, dir, dir))
	slow.Concurrent = true
	fast := a.request("sh", "-c", fmt.Sprintf(escapees, marker+1)+fmt.Sprintf("until [ -e %s/slow ]; do sleep 0.01; done; echo fast", dir))
	fast.Concurrent = true
	var wg sync.WaitGroup
	var slowOut string
	var slowRes agentproto.Result
	var slowErr error
	wg.Add(1)
	go func() { defer wg.Done(); slowRes, slowOut, _, slowErr = a.run(t.Context(), slow) }()
	res, out, _, err := a.run(t.Context(), fast)
	if err != nil || res.ExitCode != 0 || !strings.Contains(out, "fast\n") {
		t.Fatalf("fast: %+v %q %v", res, out, err)
	}
	checkGone(t, pidsOf(t, out), marker+1)
	if err := os.WriteFile(filepath.Join(dir, "fastdone"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if slowErr != nil || slowRes.ExitCode != 0 || !strings.HasSuffix(slowOut, "alive\n") {
		t.Fatalf("slow: %+v %q %v", slowRes, slowOut, slowErr)
	}
	checkGone(t, pidsOf(t, slowOut), marker)
}

// TestProcessDiesWithAgent: when the host hangs up (the channel ends), every process's tree is killed.
func TestProcessDiesWithAgent(t *testing.T) {
	t.Parallel()
	a := startMuxAgent(t)
	const marker = 999203
	pid := a.start(t, "", 30_000, false, "sh", "-c", fmt.Sprintf(escapees, marker)+"wait")
	time.Sleep(200 * time.Millisecond)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	a.op(ctx, agentproto.ProcessOp{Op: agentproto.OpAttach, PID: pid, Replay: true}, &out, nil)
	cancel()
	a.stop(t)
	checkGone(t, pidsOf(t, out.String()), marker)
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("process %d outlived its agent", pid)
	}
}
