package api

import (
	"errors"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/wire"
)

// ctTar marks a tar stream, both ways.
const ctTar = "application/x-tar"

// maxPathLen bounds a workspace path from a URL (PATH_MAX).
const maxPathLen = 4096

// FileWritten is the answer of a PUT of one file.
type FileWritten = wire.FileWritten

// FileList is the answer of GET .../files/{path}?list=1.
type FileList struct {
	Path    string        `json:"path"`
	Entries []files.Entry `json:"entries"`
}

// checkPath refuses, before the workspace is opened or created, a path that is plainly not one: a NUL, a ".."
// component, an absurd length. Everything else (absolute paths outside /workspace, symlinks leading out) is
// the business of files.FS, which resolves every path through the workspace's os.Root.
func checkPath(p string) error {
	const hint = "give a path relative to /workspace, without .."
	if len(p) > maxPathLen || strings.ContainsRune(p, 0) {
		return fault.New(fault.InvalidPath, hint, "the path is malformed")
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return fault.New(fault.InvalidPath, hint, "the path %q leaves the workspace", p)
		}
	}
	return nil
}

// parseMode reads the mode parameter of an upload: octal permission bits, e.g. 0644 or 755. Set-id and
// sticky bits are refused: a file the host writes must not grant more than its permissions.
func parseMode(v string) (fs.FileMode, error) {
	if v == "" {
		return 0o644, nil
	}
	n, err := strconv.ParseUint(v, 8, 32)
	if err != nil || n > 0o777 {
		return 0, invalid("give mode as octal permission bits, e.g. 0644 or 0755", "mode=%q is not a permission mode", v)
	}
	return fs.FileMode(n), nil
}

func isTar(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == ctTar
}

func (s *Server) handlePutFile(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p := r.PathValue("path")
	q := r.URL.Query()
	tar := isTar(r.Header.Get("Content-Type"))
	var mode fs.FileMode
	if err = checkQuery(q, "mode"); err == nil {
		if tar && q.Has("mode") {
			err = invalid("a tar carries each entry's mode; leave mode out", "mode does not apply to a tar upload")
		} else {
			mode, err = parseMode(q.Get("mode"))
		}
	}
	if err == nil {
		err = checkPath(p)
	}
	if err == nil && r.ContentLength > s.maxUp {
		err = fault.New(fault.RequestTooLarge, "upload less, or ask the operator to raise the upload bound",
			"the upload is %d bytes, over the bound of %d", r.ContentLength, s.maxUp)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ws, err := s.backend.Workspace(r.Context(), key, true)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer ws.Close()
	body := s.uploadBody(w, r)
	defer body.done()
	if tar {
		sum, err := ws.ExtractTar(r.Context(), p, body)
		if err != nil {
			s.writeError(w, r, body.cause(err))
			return
		}
		writeJSON(w, http.StatusOK, sum)
		return
	}
	n, err := ws.Write(r.Context(), p, body, mode)
	if err != nil {
		s.writeError(w, r, body.cause(err))
		return
	}
	writeJSON(w, http.StatusOK, FileWritten{Path: p, Bytes: n})
}

func (s *Server) handleGetFile(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p := r.PathValue("path")
	q := r.URL.Query()
	var list bool
	if err = checkQuery(q, "list"); err == nil {
		list, err = boolParam(q, "list")
	}
	if err == nil {
		err = checkPath(p)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ws, err := s.backend.Workspace(r.Context(), key, false)
	if fault.Is(err, fault.FileNotFound) || fault.Is(err, fault.NotFound) {
		// One answer, whatever the backend's words (they may name host paths): the same for a user of
		// another tenant as for a user that never existed.
		err = fault.New(fault.FileNotFound, "run a command or upload a file first", "user %q has no workspace", key.User)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer ws.Close()
	if list {
		entries, err := ws.List(p)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if entries == nil {
			entries = []files.Entry{}
		}
		writeJSON(w, http.StatusOK, FileList{Path: p, Entries: entries})
		return
	}
	st, err := ws.Stat(p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	switch st.Type {
	case "dir":
		s.sendTar(w, r, ws, p)
	case "file":
		s.sendFile(w, r, ws, p)
	default:
		s.writeError(w, r, fault.New(fault.FileType, "GET the directory with ?list=1 to see what it is",
			"%q is a %s, not a file or a directory", p, st.Type))
	}
}

// sendFile streams one regular file. The size announced is the one of the file opened; a file that shrinks
// meanwhile cuts the answer short (the client sees a truncated body, never a wrong one).
func (s *Server) sendFile(w http.ResponseWriter, r *http.Request, ws *files.FS, p string) {
	rc, ent, err := ws.OpenFile(p)
	if err != nil { // swapped for something else since Stat: refused as what it is now
		s.writeError(w, r, err)
		return
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(ent.Size, 10))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set(ModeHeader, ent.Mode)
	if !ent.MTime.IsZero() {
		h.Set("Last-Modified", ent.MTime.UTC().Format(http.TimeFormat))
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := io.CopyN(w, rc, ent.Size); err != nil {
		abort(r)
	}
}

// ModeHeader carries a downloaded file's permission bits (octal).
const ModeHeader = "Sandkeep-Mode"

// sendTar streams the tree under directory p as a tar. A failure before the first byte is an error answer;
// after it, the connection is cut so that the client cannot take a partial tar for a whole one.
func (s *Server) sendTar(w http.ResponseWriter, r *http.Request, ws *files.FS, p string) {
	lw := &lazyWriter{w: w, start: func() {
		w.Header().Set("Content-Type", ctTar)
		w.WriteHeader(http.StatusOK)
	}}
	if r.Method == http.MethodHead {
		lw.start()
		return
	}
	if err := ws.WriteTar(r.Context(), p, lw); err != nil {
		if !lw.started {
			s.writeError(w, r, err)
			return
		}
		abort(r)
	}
	if !lw.started { // an empty stream is not a tar; WriteTar always ends with its trailer, so this is defensive
		lw.start()
	}
}

// abort cuts the connection: the answer already started and cannot be turned into an error any more.
func abort(r *http.Request) {
	if r.Context().Err() != nil {
		infoOf(r).clientGone = true
	}
	panic(http.ErrAbortHandler)
}

// lazyWriter calls start before its first byte, so that an error found before any output still gets its own
// status.
type lazyWriter struct {
	w       io.Writer
	start   func()
	started bool
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.started = true
		l.start()
	}
	return l.w.Write(p)
}

// uploadBody is r's body within the upload bound and the minimum rate.
func (s *Server) uploadBody(w http.ResponseWriter, r *http.Request) *minRateReader {
	return &minRateReader{r: http.MaxBytesReader(w, r.Body, s.maxUp), rc: http.NewResponseController(w),
		rate: s.upRate, window: s.upWindow}
}

// minRateReader cuts a body that brings less than rate bytes per second, averaged over each window: it sets
// the connection's read deadline to the end of the window, and moves it on once the window's share has
// arrived. A slowloris upload thus holds its place (a file-operation slot, a temporary file) one window at
// most. It changes nothing when rate is 0.
type minRateReader struct {
	r      io.Reader
	rc     *http.ResponseController
	rate   int64
	window time.Duration
	got    int64 // bytes read in this window
	set    bool  // a deadline is in force
	slow   error // the UPLOAD_TOO_SLOW given, if any
}

func (m *minRateReader) Read(p []byte) (int, error) {
	if m.rate > 0 && (!m.set || m.got >= m.quota()) {
		// An http.ResponseWriter that cannot set deadlines (ErrNotSupported) leaves the body unbounded in
		// time, as before; net/http's own writers (HTTP/1 and HTTP/2) can.
		m.set = m.rc.SetReadDeadline(time.Now().Add(m.window)) == nil
		m.got = 0
	}
	n, err := m.r.Read(p)
	m.got += int64(n)
	if err != nil && m.set && errors.Is(err, os.ErrDeadlineExceeded) {
		m.slow = fault.New(fault.UploadTooSlow, "send the body faster, or ask the operator to lower the minimum upload rate",
			"the upload brought %d bytes in %v, under the minimum of %d bytes per second", m.got, m.window, m.rate)
		err = m.slow
	}
	return n, err
}

// cause is the error to answer for err, a failed upload: the body being too slow explains it whatever the
// writer made of it (net/http cancels the request's context when a read of the connection fails, so the
// writer may have seen only that).
func (m *minRateReader) cause(err error) error {
	if m.slow != nil {
		return m.slow
	}
	return err
}

func (m *minRateReader) quota() int64 { return int64(float64(m.rate) * m.window.Seconds()) }

// done lifts the deadline, so that the answer and the next request on the connection are not bound by it.
func (m *minRateReader) done() {
	if m.set {
		_ = m.rc.SetReadDeadline(time.Time{})
	}
}
