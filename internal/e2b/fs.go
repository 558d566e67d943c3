package e2b

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sandkeep/sandkeep/internal/e2b/proto/filesystem"
	"github.com/sandkeep/sandkeep/internal/e2b/proto/filesystem/filesystemconnect"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
)

// filesystemService is envd's filesystem.Filesystem over the workspace: reads through the file API
// (internal/files, never a host path), changes (mkdir, move, remove) as commands in the sandbox itself.
type filesystemService struct {
	f *Front

	mu       sync.Mutex
	watchers map[string]*watcher // by id; bounded by maxWatchers
}

var _ filesystemconnect.FilesystemHandler = (*filesystemService)(nil)

const (
	maxWatchers  = 256
	watchEvery   = 250 * time.Millisecond
	maxListDepth = 16
)

func (s *filesystemService) ws(ctx context.Context) (*sandboxCtx, *files.FS, error) {
	sc, r, err := s.f.rpcSandbox(ctx)
	if err != nil {
		return nil, nil, err
	}
	ws, err := sc.b.Workspace(ctx, sc.key, true)
	if err != nil {
		return nil, nil, s.f.connectErr(r, err)
	}
	return sc, ws.InFolder(Home), nil
}

func (s *filesystemService) fail(ctx context.Context, err error) error {
	_, r, _ := s.f.rpcSandbox(ctx)
	if r == nil {
		return connectUnauthenticated()
	}
	return s.f.connectErr(r, err)
}

// entryInfo is E2B's EntryInfo of a workspace entry at rel.
func entryInfo(rel string, e files.Entry) *filesystem.EntryInfo {
	perm, _ := strconv.ParseUint(e.Mode, 8, 32)
	mode := fs.FileMode(perm)
	t := filesystem.FileType_FILE_TYPE_UNSPECIFIED
	switch e.Type {
	case files.TypeFile:
		t = filesystem.FileType_FILE_TYPE_FILE
	case files.TypeDir:
		t, mode = filesystem.FileType_FILE_TYPE_DIRECTORY, mode|fs.ModeDir
	case files.TypeSymlink:
		t, mode = filesystem.FileType_FILE_TYPE_SYMLINK, mode|fs.ModeSymlink
	}
	name := e.Name
	if rel == "" {
		name = path.Base(Home)
	}
	info := &filesystem.EntryInfo{Name: name, Type: t, Path: displayPath(rel), Size: e.Size, Mode: uint32(mode),
		Permissions: mode.String(), Owner: "user", Group: "user", ModifiedTime: timestamppb.New(e.MTime)}
	if e.Type == files.TypeSymlink {
		target := e.Target
		info.SymlinkTarget = &target
	}
	return info
}

// rel is an E2B path as a clean workspace-relative path ("" the workspace), or INVALID_PATH.
func rel(p string) (string, error) {
	w := workspacePath(p)
	if strings.HasPrefix(w, "/") {
		if w != "/workspace" && !strings.HasPrefix(w, "/workspace/") {
			return "", fault.New(fault.InvalidPath, "use a path under "+Home+" (the sandbox's /workspace), or a relative one",
				"the path %q is outside the workspace, which is all the E2B front serves", p)
		}
		w = strings.TrimPrefix(strings.TrimPrefix(w, "/workspace"), "/")
	}
	c := path.Clean("/" + w)
	return strings.TrimPrefix(c, "/"), nil
}

func (s *filesystemService) stat(ws *files.FS, p string) (string, *filesystem.EntryInfo, error) {
	r, err := rel(p)
	if err != nil {
		return "", nil, err
	}
	e, err := ws.Stat(r)
	if err != nil {
		return r, nil, err
	}
	return r, entryInfo(r, e), nil
}

func (s *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	_, ws, err := s.ws(ctx)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	_, e, err := s.stat(ws, req.Msg.GetPath())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

func (s *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	_, ws, err := s.ws(ctx)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	if depth > maxListDepth {
		return nil, s.fail(ctx, badRequest("depth %d is over %d", depth, maxListDepth))
	}
	r, err := rel(req.Msg.GetPath())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	var out []*filesystem.EntryInfo
	if err := list(ws, r, depth, func(p string, e files.Entry) { out = append(out, entryInfo(p, e)) }); err != nil {
		return nil, s.fail(ctx, err)
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: out}), nil
}

// list walks dir to depth levels (1: its entries), calling fn for each entry; links are not followed.
func list(ws *files.FS, dir string, depth int, fn func(rel string, e files.Entry)) error {
	ents, err := ws.List(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := path.Join(dir, e.Name)
		fn(p, e)
		if e.Type == files.TypeDir && depth > 1 {
			if err := list(ws, p, depth-1, fn); err != nil && !fault.Is(err, fault.FileNotFound) {
				return err
			}
		}
	}
	return nil
}

// run runs argv in the sandbox as its user: the sandbox itself changes its files.
func (s *filesystemService) run(ctx context.Context, sc *sandboxCtx, argv ...string) error {
	res, err := s.f.exec(ctx, sc.b, sc.rec, argv, nil)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fault.New(fault.InvalidPath, "check the path", "%s failed (exit %d): %s", argv[0], res.ExitCode, strings.TrimSpace(res.Stderr))
	}
	return nil
}

func inSandbox(r string) string { return path.Join("/workspace", r) }

func (s *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	sc, ws, err := s.ws(ctx)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	r, err := rel(req.Msg.GetPath())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if _, err := ws.Stat(r); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s already exists", displayPath(r)))
	}
	if err := s.run(ctx, sc, "mkdir", "-p", "--", inSandbox(r)); err != nil {
		return nil, s.fail(ctx, err)
	}
	_, e, err := s.stat(ws, r)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

func (s *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	sc, ws, err := s.ws(ctx)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	src, _, err := s.stat(ws, req.Msg.GetSource())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	dst, err := rel(req.Msg.GetDestination())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if src == "" || dst == "" {
		return nil, s.fail(ctx, badRequest("cannot move the workspace itself"))
	}
	if err := s.run(ctx, sc, "mv", "-f", "--", inSandbox(src), inSandbox(dst)); err != nil {
		return nil, s.fail(ctx, err)
	}
	_, e, err := s.stat(ws, dst)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

func (s *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	sc, ws, err := s.ws(ctx)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	r, _, err := s.stat(ws, req.Msg.GetPath())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if r == "" {
		return nil, s.fail(ctx, badRequest("cannot remove the workspace itself"))
	}
	if err := s.run(ctx, sc, "rm", "-rf", "--", inSandbox(r)); err != nil {
		return nil, s.fail(ctx, err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// snapshot is what a watcher compares: each entry's type, size and modification time, by path.
type snapshot map[string]files.Entry

func take(ws *files.FS, dir string, recursive bool) (snapshot, error) {
	depth := 1
	if recursive {
		depth = maxListDepth
	}
	s := snapshot{}
	err := list(ws, dir, depth, func(p string, e files.Entry) { s[p] = e })
	return s, err
}

// diff returns the events that turn old into cur, sorted by path: created, written (size or time changed),
// removed. Paths are relative to dir, as E2B names them.
func diff(dir string, old, cur snapshot) []*filesystem.FilesystemEvent {
	var out []*filesystem.FilesystemEvent
	name := func(p string) string { return strings.TrimPrefix(strings.TrimPrefix(p, dir), "/") }
	for p, e := range cur {
		o, ok := old[p]
		switch {
		case !ok:
			out = append(out, &filesystem.FilesystemEvent{Name: name(p), Type: filesystem.EventType_EVENT_TYPE_CREATE})
		case o.Type == files.TypeFile && (o.Size != e.Size || !o.MTime.Equal(e.MTime)):
			out = append(out, &filesystem.FilesystemEvent{Name: name(p), Type: filesystem.EventType_EVENT_TYPE_WRITE})
		case o.Mode != e.Mode:
			out = append(out, &filesystem.FilesystemEvent{Name: name(p), Type: filesystem.EventType_EVENT_TYPE_CHMOD})
		}
	}
	for p := range old {
		if _, ok := cur[p]; !ok {
			out = append(out, &filesystem.FilesystemEvent{Name: name(p), Type: filesystem.EventType_EVENT_TYPE_REMOVE})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// WatchDir polls the directory (the workspace has no change feed the host can read on every driver) and
// streams what changed between two looks.
func (s *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	_, ws, err := s.ws(ctx)
	if err != nil {
		return err
	}
	defer ws.Close()
	dir, err := rel(req.Msg.GetPath())
	if err != nil {
		return s.fail(ctx, err)
	}
	prev, err := take(ws, dir, req.Msg.GetRecursive())
	if err != nil {
		return s.fail(ctx, err)
	}
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	keep := time.NewTicker(30 * time.Second)
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-keep.C:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-tick.C:
			cur, err := take(ws, dir, req.Msg.GetRecursive())
			if err != nil {
				if fault.Is(err, fault.FileNotFound) {
					return s.fail(ctx, err)
				}
				continue
			}
			for _, ev := range diff(dir, prev, cur) {
				if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
					return err
				}
			}
			prev = cur
		}
	}
}

// watcher is a polled watch whose events a caller collects (CreateWatcher, GetWatcherEvents).
type watcher struct {
	sandbox   string
	dir       string
	recursive bool
	prev      snapshot
}

func (s *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	sc, ws, err := s.ws(ctx)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	dir, err := rel(req.Msg.GetPath())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	snap, err := take(ws, dir, req.Msg.GetRecursive())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watchers == nil {
		s.watchers = map[string]*watcher{}
	}
	if len(s.watchers) >= maxWatchers {
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("too many watchers: remove some"))
	}
	id := newID()
	s.watchers[id] = &watcher{sandbox: sc.rec.ID, dir: dir, recursive: req.Msg.GetRecursive(), prev: snap}
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

func (s *filesystemService) watcher(sandbox, id string) (*watcher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.watchers[id]
	if !ok || w.sandbox != sandbox {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no watcher %q", id))
	}
	return w, nil
}

func (s *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	sc, ws, err := s.ws(ctx)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	w, err := s.watcher(sc.rec.ID, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	cur, err := take(ws, w.dir, w.recursive)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	s.mu.Lock()
	evs := diff(w.dir, w.prev, cur)
	w.prev = cur
	s.mu.Unlock()
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

func (s *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	sc, _, err := s.f.rpcSandbox(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := s.watcher(sc.rec.ID, req.Msg.GetWatcherId()); err != nil {
		return nil, err
	}
	s.mu.Lock()
	delete(s.watchers, req.Msg.GetWatcherId())
	s.mu.Unlock()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
