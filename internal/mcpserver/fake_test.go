package mcpserver

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
)

// fakeBackend stands in for the service: exec answers are scripted, workspaces are real (files.FS over a temp
// directory per key), so the file tools are tested against the real confinement.
type fakeBackend struct {
	dir string

	mu        sync.Mutex
	execFn    func(ctx context.Context, key sandkeep.Key, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error)
	execs     []execCall                  // every Exec, in order
	sandboxes map[string]sandkeep.Sandbox // by key hex
	sbErr     error                       // Sandbox's answer when set
	wsErr     error                       // Workspace's answer when set
}

// execCall is what one Exec received, stdin read out.
type execCall struct {
	key   sandkeep.Key
	ar    service.AdmitRequest
	req   sandkeep.ExecRequest
	stdin string
}

var _ service.Backend = (*fakeBackend)(nil)

func newFakeBackend(t *testing.T) *fakeBackend {
	return &fakeBackend{dir: t.TempDir(), sandboxes: map[string]sandkeep.Sandbox{}}
}

func (b *fakeBackend) Exec(ctx context.Context, key sandkeep.Key, ar service.AdmitRequest, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
	if err := req.Check(); err != nil { // the engine's one validator, before anything is admitted
		return nil, err
	}
	c := execCall{key: key, ar: ar, req: req}
	if req.Stdin != nil {
		data, err := io.ReadAll(req.Stdin)
		if err != nil {
			return nil, err
		}
		c.stdin = string(data)
	}
	b.mu.Lock()
	b.execs = append(b.execs, c)
	fn := b.execFn
	b.mu.Unlock()
	if fn == nil {
		return &sandkeep.ExecResult{Stdout: "ok\n"}, nil
	}
	return fn(ctx, key, req)
}

func (b *fakeBackend) calls() []execCall {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]execCall(nil), b.execs...)
}

func (b *fakeBackend) List(ctx context.Context, tenant string) ([]sandkeep.Sandbox, error) {
	return nil, errors.New("fake: List is not used by the MCP server")
}

func (b *fakeBackend) Sandbox(ctx context.Context, key sandkeep.Key) (sandkeep.Sandbox, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sbErr != nil {
		return sandkeep.Sandbox{}, b.sbErr
	}
	sb, ok := b.sandboxes[key.Hex()]
	if !ok {
		return sandkeep.Sandbox{}, fault.New(fault.NotFound, "run a command first", "no sandbox for %s", key)
	}
	return sb, nil
}

func (b *fakeBackend) Stop(ctx context.Context, key sandkeep.Key) error {
	return errors.New("fake: unused")
}
func (b *fakeBackend) Remove(ctx context.Context, key sandkeep.Key) error {
	return errors.New("fake: unused")
}

// wsDir is key's workspace directory.
func (b *fakeBackend) wsDir(key sandkeep.Key) string { return filepath.Join(b.dir, key.Hex()) }

func (b *fakeBackend) Workspace(ctx context.Context, key sandkeep.Key, create bool) (*files.FS, error) {
	b.mu.Lock()
	err := b.wsErr
	b.mu.Unlock()
	if err != nil {
		return nil, err
	}
	dir := b.wsDir(key)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if !create {
			return nil, fault.New(fault.NotFound, "run a command first", "no workspace for %s", key)
		}
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, err
		}
	}
	return files.Open(dir, -1, -1, files.Limits{})
}

func (b *fakeBackend) Runs(ctx context.Context, f store.RunFilter) ([]store.Run, error) {
	return nil, errors.New("fake: unused")
}
func (b *fakeBackend) Run(ctx context.Context, id string) (store.Run, error) {
	return store.Run{}, errors.New("fake: unused")
}
func (b *fakeBackend) Events(ctx context.Context, f store.EventFilter) ([]store.Event, error) {
	return nil, errors.New("fake: unused")
}
func (b *fakeBackend) Ready(ctx context.Context) error { return nil }

// The run and template routes belong to the HTTP API; the tools never call them.
func (b *fakeBackend) Admit(context.Context, sandkeep.Key, service.AdmitRequest) (*sandkeep.Run, error) {
	return nil, fault.New(fault.Internal, "", "the MCP tools do not admit runs directly")
}
func (b *fakeBackend) EndRun(context.Context, string, bool) error {
	return fault.New(fault.Internal, "", "the MCP tools do not end runs")
}
func (b *fakeBackend) Templates(context.Context, string) ([]string, error) { return nil, nil }
