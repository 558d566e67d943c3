package sandkeep_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/processes"
)

// processesHere: processes need the sandbox's agent channel: on Docker (under runc its socket with the transport
// auto or agent, else and under gVisor a relay through the engine's exec), on kubernetes the driver's pod
// channel, which the exec transport turns off. Elsewhere PROCESS_UNAVAILABLE (TestProcessUnavailable).
func processesHere() bool {
	if onKube {
		return os.Getenv("SANDKEEP_TRANSPORT") != "exec"
	}
	return true
}

// eventLog collects events from OnEvent.
type eventLog struct {
	mu  sync.Mutex
	all []string
	end []events.ProcessEnded
}

func (l *eventLog) add(name string, payload any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, name)
	if e, ok := payload.(events.ProcessEnded); ok {
		l.end = append(l.end, e)
	}
}

// ended waits for pid's process_ended.
func (l *eventLog) ended(t *testing.T, pid int) events.ProcessEnded {
	t.Helper()
	deadline := time.Now().Add(slack + time.Minute)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		for _, e := range l.end {
			if e.PID == pid {
				l.mu.Unlock()
				return e
			}
		}
		l.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no process_ended for pid %d; events: %v", pid, l.all)
	return events.ProcessEnded{}
}

// TestProcessBesideCommands: a dev server started as a process keeps running while the user's commands run and
// end beside it (its start does not hold the gate); it is listed, attached to (replay, then live), written to,
// and killed; each step is an event in its run.
func TestProcessBesideCommands(t *testing.T) {
	if !processesHere() {
		t.Skip("processes need the agent channel (TestProcessUnavailable)")
	}
	s := newSuite(t, baseConfig(t))
	key := s.key("proc", "u1")
	ctx := t.Context()
	var log eventLog
	p, err := processes.Start(ctx, s.m, key, processes.StartRequest{
		Argv: []string{"sh", "-c", "echo ready; while read line; do echo got $line; done; echo stdin closed; sleep 600"},
		Tag:  "dev", Stdin: true, OnEvent: log.add,
	})
	if err != nil || !p.Running || p.PID <= 0 || p.Tag != "dev" {
		t.Fatalf("StartProcess: %+v %v", p, err)
	}
	// Commands of the same user run while it runs, one after another as always.
	for i := range 3 {
		if out := s.sh(key, "echo beside"); out != "beside\n" {
			t.Fatalf("command %d beside the process: %q", i, out)
		}
	}
	ps, err := processes.List(ctx, s.m, key)
	if err != nil || len(ps) != 1 || ps[0].PID != p.PID || !ps[0].Running || !ps[0].Stdin {
		var agentLog bytes.Buffer
		if rc, lerr := s.logs(key); lerr == nil {
			_, _ = io.Copy(&agentLog, rc)
			rc.Close()
		}
		log.mu.Lock()
		defer log.mu.Unlock()
		t.Fatalf("Processes: %+v %v; events %v %+v; the sandbox's log: %q", ps, err, log.all, log.end, agentLog.String())
	}
	if err := processes.SendInput(ctx, s.m, key, processes.Ref{Tag: "dev"}, []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	if err := processes.CloseStdin(ctx, s.m, key, processes.Ref{PID: p.PID}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	got, err := processes.Attach(actx, s.m, key, processes.Ref{Tag: "dev"}, processes.AttachOptions{Stdout: &out, Replay: true})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || got == nil || !got.Running || out.String() != "ready\ngot one\nstdin closed\n" {
		t.Fatalf("attach: %+v %v %q", got, err, out.String())
	}
	if err := processes.SendInput(ctx, s.m, key, processes.Ref{PID: p.PID}, []byte("x")); !fault.Is(err, fault.InvalidArgument) {
		t.Fatalf("input after close: %v", err)
	}
	if err := processes.Kill(ctx, s.m, key, processes.Ref{Tag: "dev"}); err != nil {
		t.Fatal(err)
	}
	got, err = processes.Attach(ctx, s.m, key, processes.Ref{PID: p.PID}, processes.AttachOptions{})
	if err != nil || got.Running || !got.Killed {
		t.Fatalf("after kill: %+v %v", got, err)
	}
	if e := log.ended(t, p.PID); e.Reason != events.ProcessKilled || e.Tag != "dev" {
		t.Fatalf("process_ended: %+v", e)
	}
	if err := processes.Signal(ctx, s.m, key, processes.Ref{PID: p.PID}, syscall.SIGTERM); !fault.Is(err, fault.ProcessExited) {
		t.Fatalf("signal to an exited process: %v", err)
	}
	if err := processes.Kill(ctx, s.m, key, processes.Ref{Tag: "no-such"}); !fault.Is(err, fault.ProcessNotFound) {
		t.Fatalf("unknown tag: %v", err)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if !strings.Contains(strings.Join(log.all, ","), events.NameProcessStarted) {
		t.Fatalf("no process_started: %v", log.all)
	}
}

// TestProcessEnds: a process dies with its tree when its lifetime bound passes and when its sandbox stops, with
// a process_ended event saying which.
func TestProcessEnds(t *testing.T) {
	if !processesHere() {
		t.Skip("processes need the agent channel (TestProcessUnavailable)")
	}
	s := newSuite(t, baseConfig(t))
	key := s.key("proc", "u2")
	ctx := t.Context()
	var log eventLog
	bounded, err := processes.Start(ctx, s.m, key, processes.StartRequest{Argv: []string{"sleep", "600"}, Lifetime: 2 * time.Second, OnEvent: log.add})
	if err != nil {
		t.Fatal(err)
	}
	long, err := processes.Start(ctx, s.m, key, processes.StartRequest{Argv: []string{"sh", "-c", "sleep 600 & sleep 600"}, OnEvent: log.add})
	if err != nil {
		t.Fatal(err)
	}
	if e := log.ended(t, bounded.PID); e.Reason != events.ProcessLifetime {
		t.Fatalf("bounded: %+v", e)
	}
	if err := s.m.Stop(ctx, key); err != nil {
		t.Fatal(err)
	}
	if e := log.ended(t, long.PID); e.Reason != events.ProcessSandboxEnded {
		t.Fatalf("after stop: %+v", e)
	}
	// The sandbox starts again for the next command, without the process.
	s.sh(key, "true")
	ps, err := processes.List(ctx, s.m, key)
	if err != nil || len(ps) != 0 {
		t.Fatalf("after a restart: %+v %v", ps, err)
	}
	if out := s.sh(key, "ps -o args | grep -c '[s]leep 600' || true"); strings.TrimSpace(out) != "0" {
		t.Fatalf("sleep still runs after the stop: %q", out)
	}
}

// TestProcessTreesApart: two processes at once each leave an orphan that left their tree (setsid, its parent
// gone); a command that ends beside them takes neither, and killing one process ends its own orphan only. Under
// gVisor, where no supervisor may be a subreaper, the orphans go to PID 1 and are told apart by their
// supervisors' marks (cmd/sandkeep-agent/tree_linux.go).
func TestProcessTreesApart(t *testing.T) {
	if !processesHere() {
		t.Skip("processes need the agent channel (TestProcessUnavailable)")
	}
	s := newSuite(t, baseConfig(t))
	key := s.key("proc", "u6")
	ctx := t.Context()
	for _, n := range []string{"601", "602"} {
		p, err := processes.Start(ctx, s.m, key, processes.StartRequest{Tag: n,
			Argv: []string{"sh", "-c", "setsid sh -c 'sleep " + n + " &' </dev/null >/dev/null 2>&1; sleep 600"}})
		if err != nil || !p.Running {
			t.Fatalf("StartProcess %s: %+v %v", n, p, err)
		}
	}
	orphans := func(want string) {
		t.Helper()
		var got string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if got = s.sh(key, "ps -o args | grep -E '^sleep 60[12]$' | sort | tr '\\n' ' '"); got == want {
				return
			}
		}
		t.Fatalf("orphans running: %q, want %q", got, want)
	}
	orphans("sleep 601 sleep 602 ")
	orphans("sleep 601 sleep 602 ") // the commands that listed them ended beside them
	if err := processes.Kill(ctx, s.m, key, processes.Ref{Tag: "601"}); err != nil {
		t.Fatal(err)
	}
	orphans("sleep 602 ")
	if err := processes.Kill(ctx, s.m, key, processes.Ref{Tag: "602"}); err != nil {
		t.Fatal(err)
	}
	orphans("")
}

// TestConcurrentExec: commands of one user that ask run at once; those that do not still wait their turn.
func TestConcurrentExec(t *testing.T) {
	if !processesHere() {
		t.Skip("concurrency needs the agent channel (TestProcessUnavailable)")
	}
	s := newSuite(t, baseConfig(t))
	key := s.key("proc", "u3")
	s.sh(key, "true") // the sandbox exists
	ctx := t.Context()
	var slowEnd time.Time
	var slowErr error
	var wg sync.WaitGroup
	wg.Add(1)
	tl := newTimeline("slow-started")
	go func() {
		defer wg.Done()
		var res *sandkeep.ExecResult
		res, slowErr = s.m.Exec(ctx, key, sandkeep.ExecRequest{Argv: []string{"sh", "-c", "echo slow-started; sleep 3"},
			Stdout: tl, Concurrent: true})
		if slowErr == nil && res.ExitCode != 0 {
			slowErr = errors.New("slow command failed")
		}
		slowEnd = time.Now()
	}()
	tl.wait(t, "slow-started", slack)
	res, err := s.m.Exec(ctx, key, sandkeep.ExecRequest{Argv: []string{"echo", "fast"}, Concurrent: true})
	fastEnd := time.Now()
	if err != nil || res.Stdout != "fast\n" {
		t.Fatalf("fast: %+v %v", res, err)
	}
	// A command with a secret file runs alone (its file is the sandbox's while it runs), after the slow one.
	res, err = s.m.Exec(ctx, key, sandkeep.ExecRequest{Argv: []string{"cat", "/run/secrets/token"}, Concurrent: true,
		Secrets: []sandkeep.Secret{{Name: "token", Path: "/run/secrets/token", Value: []byte("s3cret")}}})
	secretEnd := time.Now()
	if err != nil || res.Stdout != "s3cret" {
		t.Fatalf("secret: %+v %v", res, err)
	}
	wg.Wait()
	if slowErr != nil {
		t.Fatal(slowErr)
	}
	if !fastEnd.Before(slowEnd) || secretEnd.Before(slowEnd) {
		t.Fatalf("fast ended %v, slow %v, secret %v: want fast before slow, secret after", fastEnd, slowEnd, secretEnd)
	}
}

// TestProcessUnavailable: where this process cannot have the sandbox's agent channel, a process is refused
// with PROCESS_UNAVAILABLE and nothing starts: on kubernetes with the exec transport (no pod channel), and on
// Docker while another process holds the channel (its agent turns a second session away: the relay of a manager
// with the exec transport beside one that serves the socket, or under gVisor beside another relay).
func TestProcessUnavailable(t *testing.T) {
	cfg := baseConfig(t)
	if onKube && processesHere() {
		cfg = withTransport(t, cfg, "exec")
	}
	s := newSuite(t, cfg)
	key := s.key("proc", "u4")
	m := s.m
	if !onKube && processesHere() {
		s = newSuite(t, withTransport(t, cfg, "auto"))
		key = s.key("proc", "u4")
		holder, err := processes.Start(t.Context(), s.m, key, processes.StartRequest{Argv: []string{"sleep", "60"}})
		if err != nil || !holder.Running {
			t.Fatalf("the holder's process: %+v %v", holder, err)
		}
		m = s.open(withTransport(t, s.cfg, "exec"))
	}
	_, err := processes.Start(t.Context(), m, key, processes.StartRequest{Argv: []string{"sleep", "60"}})
	if !fault.Is(err, fault.ProcessUnavailable) {
		t.Fatalf("StartProcess: %v", err)
	}
	if !onKube && processesHere() {
		if ps, err := processes.List(t.Context(), s.m, key); err != nil || len(ps) != 1 {
			t.Fatalf("the holder's processes after the refusal: %+v %v", ps, err)
		}
	}
}

// TestRelayOnlyFromTheEngine: the sandbox's init takes a relayed channel session only from uid 0, which only
// the engine's exec makes: a command that runs the relay itself (as the sandbox's user) is turned away and gets
// no session, while the host's relay (the exec transport's processes) is taken. Under gVisor too, whose sentry
// checks the credentials a process claims as the kernel does.
func TestRelayOnlyFromTheEngine(t *testing.T) {
	if onKube {
		t.Skip("the kubernetes driver has no relay: its pods' channel is the pod network")
	}
	s := newSuite(t, withTransport(t, baseConfig(t), "exec"))
	key := s.key("proc", "u5")
	out := s.sh(key, "/.sandkeep/sandkeep-agent relay </dev/null; echo exit=$?")
	if strings.Contains(out, "ok") || !strings.Contains(out, "exit=1") {
		t.Fatalf("a command's relay: %q, want it turned away", out)
	}
	if !processesHere() {
		return
	}
	p, err := processes.Start(t.Context(), s.m, key, processes.StartRequest{Argv: []string{"sleep", "60"}, Tag: "after"})
	if err != nil || !p.Running {
		t.Fatalf("the host's relay after a command's: %+v %v", p, err)
	}
	// While the host's session is up, a command's relay is turned away too, and the session goes on.
	out = s.sh(key, "/.sandkeep/sandkeep-agent relay </dev/null; echo exit=$?")
	if strings.Contains(out, "ok") || !strings.Contains(out, "exit=1") {
		t.Fatalf("a command's relay beside the host's session: %q", out)
	}
	if ps, err := processes.List(t.Context(), s.m, key); err != nil || len(ps) != 1 || !ps[0].Running {
		t.Fatalf("the host's session after a command's relay: %+v %v", ps, err)
	}
}
