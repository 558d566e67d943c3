// Package apitest holds the fakes the API's and the Go SDK's tests run a real api.Server over: a
// service.Backend that keeps sandboxes, runs and events in memory (and workspaces in a directory), and a token
// store. They stand in for the layers below the API, never for the API itself.
package apitest

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/snapshots"
)

// Backend is an in-memory service.Backend. Exec runs no process: it interprets argv (see Exec).
type Backend struct {
	// ExecHook, when set, replaces Exec's interpreter (still after the run bookkeeping).
	ExecHook func(ctx context.Context, key sandkeep.Key, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error)
	// ReadyErr is what Ready returns.
	ReadyErr error
	// FileLimits bound the workspaces Workspace opens.
	FileLimits files.Limits
	// TemplateNames are the templates every tenant may use; a run that names another is TEMPLATE_NOT_FOUND.
	TemplateNames []string

	root string // workspaces live in root/<key hex>

	mu        sync.Mutex
	boxes     map[string]sandkeep.Sandbox // by key hex
	runs      map[string]store.Run
	events    []store.Event
	logs      []store.RunLog
	seq       int64
	execs     int                    // Exec calls that reached the interpreter or the hook
	lastReq   sandkeep.ExecRequest   // the last one
	lastAdmit service.AdmitRequest   // and its admission
	waiters   map[string]chan string // "wait=<name>" steps blocked until Release(name)

	snaps map[string]snapshots.Snapshot // snapshot.go; nil until the first

	procOnce sync.Once
	procs    *procTable // the fake processes (process.go)
}

var _ service.Backend = (*Backend)(nil)

// NewBackend returns an empty backend whose workspaces live under dir.
func NewBackend(dir string) *Backend {
	return &Backend{root: dir, boxes: map[string]sandkeep.Sandbox{}, runs: map[string]store.Run{},
		waiters: map[string]chan string{}}
}

// Exec records a run (or attaches to req.RunID), emits the events a real sandbox would (sandbox_started when
// the sandbox is new or stopped, exec_started, exec_finished), and interprets argv:
//
//   - ["echo", args...]: prints args joined by spaces and a newline.
//   - ["cat"]: prints its stdin.
//   - ["fake", steps...]: each step in order: "out=TEXT" and "err=TEXT" write TEXT to stdout or stderr;
//     "exit=N" sets the exit code; "timeout" marks it timed out; "sleep" blocks until ctx ends (then the
//     result is partial and the error is ctx's); "wait=NAME" blocks until Release(NAME); "gatewait=MS" emits an event whose payload waited MS at the gate; "event=NAME" emits
//     event NAME with a zero payload.
//   - anything else: prints argv joined by spaces and a newline.
func (b *Backend) Exec(ctx context.Context, key sandkeep.Key, ar service.AdmitRequest, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
	if err := req.Check(); err != nil { // the engine's one validator, before anything is admitted
		return nil, err
	}
	emit := func(name string, payload any) {
		if ar.Observer.Event != nil {
			ar.Observer.Event(name, payload)
		}
	}
	runID, err := b.runFor(key, ar.RunID)
	if err != nil {
		return nil, err
	}
	record := func(name string, payload any) {
		emit(name, payload)
		if e, err := events.New(runID, name, payload); err == nil {
			e.RequestID = ar.RequestID
			b.AppendEvent(e)
		}
	}
	b.mu.Lock()
	b.execs++
	b.lastReq, b.lastAdmit = req, ar
	sb, ok := b.boxes[key.Hex()]
	started := !ok || sb.State != "running"
	if started {
		sb = sandkeep.Sandbox{Tenant: key.Tenant, User: key.User, Key: key.Hex(), Name: key.ContainerName(),
			ID: "c-" + key.Short(), State: "running", Image: "fake:latest", CreatedAt: orNow(sb.CreatedAt)}
		b.boxes[key.Hex()] = sb
	}
	sb.LastUsed = time.Now().UTC()
	b.boxes[key.Hex()] = sb
	b.mu.Unlock()
	if err := os.MkdirAll(b.workspace(key), 0o755); err != nil {
		return nil, err
	}
	if started {
		record(events.NameSandboxStarted, events.SandboxStarted{Sandbox: sb.Name, Driver: "fake", Created: !ok})
	}
	record(events.NameExecStarted, events.ExecStarted{Sandbox: sb.Name, Command: events.Command(req.Argv), Transport: "exec"})
	if ar.Observer.Started != nil {
		ar.Observer.Started()
	}
	var res *sandkeep.ExecResult
	if b.ExecHook != nil {
		res, err = b.ExecHook(ctx, key, req)
	} else {
		res, err = b.interpret(ctx, key, req, emit)
	}
	if res != nil {
		res.Sandbox = sandkeep.SandboxRef{Name: sb.Name, ID: sb.ID, Driver: "fake", Tenant: key.Tenant, User: key.User}
		record(events.NameExecFinished, events.ExecFinished{ExitCode: res.ExitCode, TimedOut: res.TimedOut, Transport: "exec"})
	}
	if ar.RunID == "" {
		status := store.StatusSucceeded
		if err != nil {
			status = store.StatusFailed
		}
		b.FinishRun(runID, status)
	}
	return res, err
}

func orNow(t time.Time) time.Time {
	if t.IsZero() {
		return time.Now().UTC()
	}
	return t
}

func (b *Backend) runFor(key sandkeep.Key, runID string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if runID != "" {
		r, ok := b.runs[runID]
		if !ok || r.Tenant != key.Tenant || r.User != key.User || r.Status != store.StatusRunning {
			return "", fault.New(fault.RunNotFound, "start a run first", "no running run %q for this user", runID)
		}
		return r.ID, nil
	}
	id, err := store.NewRunID()
	if err != nil {
		return "", err
	}
	b.runs[id] = store.Run{ID: id, Tenant: key.Tenant, User: key.User, Trust: store.TrustTrusted, ResolvedMode: "inline",
		Source: "default", Driver: "fake", Admission: store.AdmissionAdmitted, Status: store.StatusRunning,
		CreatedAt: events.Now()}
	return id, nil
}

func (b *Backend) interpret(ctx context.Context, key sandkeep.Key, req sandkeep.ExecRequest, emit func(string, any)) (*sandkeep.ExecResult, error) {
	var outBuf, errBuf strings.Builder
	stdout, stderr := io.Writer(&outBuf), io.Writer(&errBuf)
	if req.Stdout != nil {
		stdout = req.Stdout
	}
	if req.Stderr != nil {
		stderr = req.Stderr
	}
	start := time.Now()
	res := &sandkeep.ExecResult{Transport: "exec"}
	finish := func(err error) (*sandkeep.ExecResult, error) {
		res.Stdout, res.Stderr = outBuf.String(), errBuf.String()
		res.DurationMS = time.Since(start).Milliseconds()
		return res, err
	}
	argv := req.Argv
	switch {
	case len(argv) == 0:
		return nil, fault.New(fault.InvalidArgument, "give a command", "the request has no command")
	case argv[0] == "echo":
		_, _ = io.WriteString(stdout, strings.Join(argv[1:], " ")+"\n")
	case argv[0] == "cat":
		if req.Stdin != nil {
			_, _ = io.Copy(stdout, req.Stdin)
		}
	case argv[0] == "fake":
		for _, step := range argv[1:] {
			name, val, _ := strings.Cut(step, "=")
			switch name {
			case "out":
				_, _ = io.WriteString(stdout, val)
			case "err":
				_, _ = io.WriteString(stderr, val)
			case "exit":
				res.ExitCode, _ = strconv.Atoi(val)
			case "timeout":
				res.TimedOut, res.ExitCode = true, 124
			case "sleep":
				<-ctx.Done()
				return finish(ctx.Err())
			case "wait":
				select {
				case <-b.waiter(val):
				case <-ctx.Done():
					return finish(ctx.Err())
				}
			case "event":
				emit(val, nil)
			case "gatewait":
				ms, _ := strconv.ParseInt(val, 10, 64)
				emit("gate_waited", &GateWaited{GateWaitMS: ms})
			}
		}
	default:
		_, _ = io.WriteString(stdout, strings.Join(argv, " ")+"\n")
	}
	return finish(nil)
}

// GateWaited is the payload of the "gatewait=MS" step: any payload with a GateWaitMS is a gate wait to the metrics.
type GateWaited struct{ GateWaitMS int64 }

func (b *Backend) waiter(name string) chan string {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch, ok := b.waiters[name]
	if !ok {
		ch = make(chan string)
		b.waiters[name] = ch
	}
	return ch
}

// Release lets the commands blocked in "wait=NAME" go on.
func (b *Backend) Release(name string) { close(b.waiter(name)) }

// LastAdmit returns the admission of the last command that reached the interpreter or the hook.
func (b *Backend) LastAdmit() service.AdmitRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastAdmit
}

// Execs returns how many commands reached the interpreter, and the last one's request.
func (b *Backend) Execs() (int, sandkeep.ExecRequest) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.execs, b.lastReq
}

// List returns tenant's sandboxes, sorted by user.
func (b *Backend) List(ctx context.Context, tenant string) ([]sandkeep.Sandbox, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []sandkeep.Sandbox
	for _, sb := range b.boxes {
		if sb.Tenant == tenant {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, c sandkeep.Sandbox) int { return strings.Compare(a.User, c.User) })
	return out, nil
}

func errNoSandbox(key sandkeep.Key) error {
	return fault.New(fault.NotFound, "GET /v1/sandboxes lists the sandboxes that exist", "no sandbox for user %q", key.User)
}

// Sandbox describes key's sandbox.
func (b *Backend) Sandbox(ctx context.Context, key sandkeep.Key) (sandkeep.Sandbox, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	sb, ok := b.boxes[key.Hex()]
	if !ok {
		return sandkeep.Sandbox{}, errNoSandbox(key)
	}
	return sb, nil
}

// Stop marks key's sandbox exited.
func (b *Backend) Stop(ctx context.Context, key sandkeep.Key) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	sb, ok := b.boxes[key.Hex()]
	if !ok {
		return errNoSandbox(key)
	}
	sb.State = "exited"
	b.boxes[key.Hex()] = sb
	return nil
}

// Remove deletes key's sandbox and workspace.
func (b *Backend) Remove(ctx context.Context, key sandkeep.Key) error {
	b.mu.Lock()
	_, ok := b.boxes[key.Hex()]
	delete(b.boxes, key.Hex())
	b.mu.Unlock()
	_, err := os.Stat(b.workspace(key))
	if !ok && errors.Is(err, os.ErrNotExist) {
		return errNoSandbox(key)
	}
	return os.RemoveAll(b.workspace(key))
}

// Root is the directory the workspaces live in.
func (b *Backend) Root() string { return b.root }

func (b *Backend) workspace(key sandkeep.Key) string { return filepath.Join(b.root, key.Hex()) }

// Workspace opens key's workspace directory with files.Open, as the real backend does.
func (b *Backend) Workspace(ctx context.Context, key sandkeep.Key, create bool) (*files.FS, error) {
	dir := b.workspace(key)
	if create {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	} else if _, err := os.Stat(dir); err != nil {
		return nil, fault.New(fault.FileNotFound, "run a command or upload a file first", "no workspace for user %q", key.User)
	}
	return files.Open(dir, -1, -1, b.FileLimits)
}

// Runs lists runs matching f, newest first.
func (b *Backend) Runs(ctx context.Context, f store.RunFilter) ([]store.Run, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []store.Run
	for _, r := range b.runs {
		if (f.Tenant == "" || r.Tenant == f.Tenant) && (f.User == "" || r.User == f.User) &&
			(f.Status == "" || r.Status == f.Status) && (f.Before.IsZero() || r.CreatedAt.Before(f.Before)) {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, c store.Run) int { return strings.Compare(c.ID, a.ID) }) // UUIDv7: newest first
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// Run returns run id, or RUN_NOT_FOUND.
func (b *Backend) Run(ctx context.Context, id string) (store.Run, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.runs[id]
	if !ok {
		return store.Run{}, fault.New(fault.RunNotFound, "", "no run %s", id)
	}
	return r, nil
}

// Events lists the events matching f in sequence order.
func (b *Backend) Events(ctx context.Context, f store.EventFilter) ([]store.Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []store.Event
	for _, e := range b.events {
		if (f.RunID == "" || e.RunID == f.RunID) && e.Seq > f.AfterSeq {
			out = append(out, e)
			if f.Limit > 0 && len(out) == f.Limit {
				break
			}
		}
	}
	return out, nil
}

// Admit records a running run of key (or checks req.RunID), as Exec's implicit runs are recorded.
func (b *Backend) Admit(ctx context.Context, key sandkeep.Key, req service.AdmitRequest) (*sandkeep.Run, error) {
	if req.Template != "" && !slices.Contains(b.TemplateNames, req.Template) {
		return nil, fault.New(fault.TemplateNotFound, "list the templates", "no template %q", req.Template)
	}
	id, err := b.runFor(key, req.RunID)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.runs[id]
	return &sandkeep.Run{ID: r.ID, Tenant: r.Tenant, User: r.User, Mode: r.ResolvedMode, Source: r.Source, Trust: r.Trust,
		Driver: r.Driver, Admission: r.Admission, Template: req.Template}, nil
}

// EndRun finishes run id.
func (b *Backend) EndRun(ctx context.Context, id string, failed bool) error {
	status := store.StatusSucceeded
	if failed {
		status = store.StatusFailed
	}
	b.FinishRun(id, status)
	return nil
}

// Templates returns TemplateNames.
func (b *Backend) Templates(ctx context.Context, tenant string) ([]string, error) {
	return slices.Clone(b.TemplateNames), nil
}

// Ready returns ReadyErr.
func (b *Backend) Ready(ctx context.Context) error { return b.ReadyErr }

// AddRun records r (a zero CreatedAt is now; an empty Status is running) and returns it.
func (b *Backend) AddRun(r store.Run) store.Run {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.ID == "" {
		r.ID, _ = store.NewRunID()
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = events.Now()
	}
	if r.Status == "" {
		r.Status = store.StatusRunning
	}
	b.runs[r.ID] = r
	return r
}

// FinishRun sets run id's status.
func (b *Backend) FinishRun(id, status string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.runs[id]
	r.Status, r.FinishedAt = status, events.Now()
	b.runs[id] = r
}

// AppendEvent records e with the next sequence number and returns it.
func (b *Backend) AppendEvent(e store.Event) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	e.Seq = b.seq
	if e.Time.IsZero() {
		e.Time = events.Now()
	}
	if len(e.Payload) == 0 {
		e.Payload = []byte("{}")
	}
	b.events = append(b.events, e)
	return e.Seq
}

// AppendRunLog adds an entry to a run's log, as the engine does while it provides the run's sandbox.
func (b *Backend) AppendRunLog(l store.RunLog) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	l.Seq = b.seq
	if l.Time.IsZero() {
		l.Time = events.Now()
	}
	b.logs = append(b.logs, l)
	return l.Seq
}

// RunLogs lists one run's log entries in sequence order (service.RunLogLister).
func (b *Backend) RunLogs(ctx context.Context, f store.RunLogFilter) ([]store.RunLog, error) {
	if err := store.CheckRunLogFilter(f); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []store.RunLog
	for _, l := range b.logs {
		if l.RunID == f.RunID && l.Seq > f.AfterSeq {
			out = append(out, l)
			if f.Limit > 0 && len(out) == f.Limit {
				break
			}
		}
	}
	return out, nil
}

var _ service.RunLogLister = (*Backend)(nil)

// Tokens is an in-memory token store.
type Tokens struct {
	mu     sync.Mutex
	byHash map[string]store.Token
}

// NewTokens returns an empty token store.
func NewTokens() *Tokens { return &Tokens{byHash: map[string]store.Token{}} }

// Add makes a live token of tenant with scopes and returns its secret and its record.
func (t *Tokens) Add(tenant string, scopes ...string) (string, store.Token) {
	secret := auth.Generate()
	tok := store.Token{ID: auth.NewID(), Tenant: tenant, Name: "test", Scopes: scopes, Hash: auth.Hash(secret),
		CreatedAt: time.Now().UTC()}
	t.Put(tok)
	return secret, tok
}

// Put stores tok as is (revoked or expired ones too).
func (t *Tokens) Put(tok store.Token) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byHash[tok.Hash] = tok
}

// TokenByHash returns the token with hash, or an error wrapping errdefs.ErrNotFound.
func (t *Tokens) TokenByHash(ctx context.Context, hash string) (store.Token, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tok, ok := t.byHash[hash]
	if !ok {
		return store.Token{}, store.ErrTokenNotFound("token by hash", "with that hash")
	}
	return tok, nil
}
