package apitest

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/processes"
)

var _ service.ProcessBackend = (*Backend)(nil)

// fakeProc is one process of the fake: its output is "started: ARGV\n" and then its input, echoed.
type fakeProc struct {
	p   processes.Process
	out strings.Builder
	sig []syscall.Signal
}

type procTable struct {
	mu      sync.Mutex
	next    map[string]int // per key: pids are the sandbox's own
	byKey   map[string][]*fakeProc
	changed chan struct{} // closed and replaced on every change
}

func (b *Backend) procTable() *procTable {
	b.procOnce.Do(func() {
		b.procs = &procTable{next: map[string]int{}, byKey: map[string][]*fakeProc{}, changed: make(chan struct{})}
	})
	return b.procs
}

func (t *procTable) notify() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// StartProcess starts a fake process in key's sandbox (creating the sandbox as an exec would).
func (b *Backend) StartProcess(ctx context.Context, key sandkeep.Key, req processes.StartRequest) (*processes.Process, error) {
	if len(req.Argv) == 0 {
		return nil, fault.New(fault.InvalidArgument, "pass the command", "no command given")
	}
	res, err := b.Exec(ctx, key, service.AdmitRequest{RunID: req.RunID, Template: req.Template, Trust: req.Trust,
		RequestID: req.RequestID}, sandkeep.ExecRequest{Argv: []string{"true"}})
	if err != nil {
		return nil, err
	}
	t := b.procTable()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, fp := range t.byKey[key.Hex()] {
		if req.Tag != "" && fp.p.Tag == req.Tag && fp.p.Running {
			return nil, fault.New(fault.InvalidArgument, "use another tag", "tag %q is taken", req.Tag)
		}
	}
	if t.next[key.Hex()] == 0 {
		t.next[key.Hex()] = 100
	}
	t.next[key.Hex()]++
	fp := &fakeProc{p: processes.Process{PID: t.next[key.Hex()], Tag: req.Tag, Argv: req.Argv, Workdir: req.Workdir, Stdin: req.Stdin,
		TTY: req.TTY != nil, Started: time.Now().UTC(), Running: true, Sandbox: res.Sandbox.Name}}
	fp.out.WriteString("started: " + strings.Join(req.Argv, " ") + "\n")
	t.byKey[key.Hex()] = append(t.byKey[key.Hex()], fp)
	t.notify()
	p := fp.p
	return &p, nil
}

// Processes lists key's fake processes.
func (b *Backend) Processes(ctx context.Context, key sandkeep.Key) ([]processes.Process, error) {
	t := b.procTable()
	t.mu.Lock()
	defer t.mu.Unlock()
	out := []processes.Process{}
	for _, fp := range t.byKey[key.Hex()] {
		out = append(out, fp.p)
	}
	return out, nil
}

func (t *procTable) find(key sandkeep.Key, ref processes.Ref) (*fakeProc, error) {
	for _, fp := range t.byKey[key.Hex()] {
		if (ref.PID != 0 && fp.p.PID == ref.PID) || (ref.PID == 0 && fp.p.Tag == ref.Tag) {
			return fp, nil
		}
	}
	what := "pid " + strconv.Itoa(ref.PID)
	if ref.PID == 0 {
		what = "tag " + strconv.Quote(ref.Tag)
	}
	return nil, fault.New(fault.ProcessNotFound, "list the processes", "no process with %s", what)
}

// AttachProcess writes the process's output (all of it with Replay or Snapshot, else what comes from now on)
// until it ends, ctx ends, or at once with Snapshot.
func (b *Backend) AttachProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, opts processes.AttachOptions) (*processes.Process, error) {
	t := b.procTable()
	t.mu.Lock()
	fp, err := t.find(key, ref)
	if err != nil {
		t.mu.Unlock()
		return nil, err
	}
	sent := fp.out.Len()
	if opts.Replay || opts.Snapshot {
		sent = 0
	}
	for {
		if s := fp.out.String(); len(s) > sent && opts.Stdout != nil {
			_, _ = opts.Stdout.Write([]byte(s[sent:]))
		}
		sent = fp.out.Len()
		p, changed := fp.p, t.changed
		if !p.Running || opts.Snapshot {
			t.mu.Unlock()
			return &p, nil
		}
		t.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return &p, context.Cause(ctx)
		}
		t.mu.Lock()
	}
}

// control finds ref's running process and applies f under the table's lock.
func (b *Backend) control(key sandkeep.Key, ref processes.Ref, f func(*fakeProc) error) error {
	t := b.procTable()
	t.mu.Lock()
	defer t.mu.Unlock()
	fp, err := t.find(key, ref)
	if err != nil {
		return err
	}
	if !fp.p.Running {
		return fault.New(fault.ProcessExited, "start it again", "process %d has exited", fp.p.PID)
	}
	err = f(fp)
	t.notify()
	return err
}

// SendInput echoes data into the process's output.
func (b *Backend) SendInput(ctx context.Context, key sandkeep.Key, ref processes.Ref, data []byte) error {
	return b.control(key, ref, func(fp *fakeProc) error {
		if !fp.p.Stdin {
			return fault.New(fault.InvalidArgument, "start it with stdin", "process %d has no open stdin", fp.p.PID)
		}
		fp.out.Write(data)
		return nil
	})
}

// CloseStdin closes the process's stdin.
func (b *Backend) CloseStdin(ctx context.Context, key sandkeep.Key, ref processes.Ref) error {
	return b.control(key, ref, func(fp *fakeProc) error {
		if !fp.p.Stdin {
			return fault.New(fault.InvalidArgument, "start it with stdin", "process %d has no open stdin", fp.p.PID)
		}
		fp.p.Stdin = false
		fp.out.WriteString("stdin closed\n")
		return nil
	})
}

// SignalProcess records sig; TERM, KILL and INT end the process with 128+sig.
func (b *Backend) SignalProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, sig syscall.Signal) error {
	return b.control(key, ref, func(fp *fakeProc) error {
		fp.sig = append(fp.sig, sig)
		fp.out.WriteString("signal " + strconv.Itoa(int(sig)) + "\n")
		if sig == syscall.SIGTERM || sig == syscall.SIGKILL || sig == syscall.SIGINT {
			fp.p.Running, fp.p.ExitCode, fp.p.Signal = false, 128+int(sig), int(sig)
		}
		return nil
	})
}

// KillProcess ends the process, killed.
func (b *Backend) KillProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref) error {
	return b.control(key, ref, func(fp *fakeProc) error {
		fp.p.Running, fp.p.Killed, fp.p.ExitCode, fp.p.Signal = false, true, 137, 9
		return nil
	})
}

// ResizeProcess checks that the process has a terminal.
func (b *Backend) ResizeProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, ws sandkeep.WindowSize) error {
	return b.control(key, ref, func(fp *fakeProc) error {
		if !fp.p.TTY {
			return fault.New(fault.InvalidArgument, "start it with a terminal", "process %d has no terminal", fp.p.PID)
		}
		fp.out.WriteString("resized " + strconv.Itoa(int(ws.Rows)) + "x" + strconv.Itoa(int(ws.Cols)) + "\n")
		return nil
	})
}
