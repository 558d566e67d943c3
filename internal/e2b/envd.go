package e2b

import (
	"context"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strings"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/service"
)

// Home is where E2B programs believe their home is; the front maps it (and "~", and relative paths) onto the
// sandbox's persistent workspace.
const Home = "/home/user"

// sandboxCtx is what an authenticated envd request knows.
type sandboxCtx struct {
	rec *record
	key sandkeep.Key
	b   service.Backend
}

type sandboxKey struct{}

// authEnvd authenticates an envd request: the E2b-Sandbox-Id header names a sandbox, X-Access-Token is its
// envd access token, and the token that created it is still live with scope. A sandbox that does not exist,
// another's token or none all answer 401 alike; a paused sandbox answers 502 (E2B's "not running").
func (f *Front) authEnvd(r *http.Request, scope string) (*sandboxCtx, error) {
	b, hooks := f.backend()
	rec, err := f.recs.get(r.Header.Get("E2b-Sandbox-Id"))
	if errors.Is(err, errNoRecord) || (err == nil && !rec.accessOK(r.Header.Get("X-Access-Token"))) {
		return nil, &statusError{status: http.StatusUnauthorized, msg: "unknown sandbox or invalid X-Access-Token"}
	}
	if err != nil {
		return nil, err
	}
	if _, err := hooks.Reauthenticate(r, rec.TokenHash, scope); err != nil {
		return nil, err
	}
	if rec.Paused {
		return nil, &statusError{status: http.StatusBadGateway, msg: "sandbox " + rec.ID + " is paused: connect to resume it"}
	}
	key, err := keyOf(rec)
	if err != nil {
		return nil, err
	}
	return &sandboxCtx{rec: rec, key: key, b: b}, nil
}

// envd wraps an envd HTTP handler with authEnvd (files scope).
func (f *Front) envd(h func(http.ResponseWriter, *http.Request, *sandboxCtx)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sc, err := f.authEnvd(r, auth.ScopeFiles)
		if err != nil {
			f.writeError(w, r, err)
			return
		}
		h(w, r, sc)
	}
}

// envdRPC wraps a Connect handler: authEnvd with the scope of its service (process: exec; filesystem: files).
// The outcome goes into the context, and each method answers a refusal as its Connect error (rpcSandbox), so
// the error is framed as the protocol wants for unary and streaming calls alike.
func (f *Front) envdRPC(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scope := auth.ScopeFiles
		if strings.HasPrefix(r.URL.Path, "/process.") {
			scope = auth.ScopeExec
		}
		sc, err := f.authEnvd(r, scope)
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sandboxKey{}, &rpcAuth{sc: sc, err: err, r: r})))
	})
}

// rpcAuth is what envdRPC found for a call.
type rpcAuth struct {
	sc  *sandboxCtx
	err error
	r   *http.Request
}

// rpcSandbox returns the call's sandbox, or its refusal as a Connect error.
func (f *Front) rpcSandbox(ctx context.Context) (*sandboxCtx, *http.Request, error) {
	a, _ := ctx.Value(sandboxKey{}).(*rpcAuth)
	if a == nil {
		return nil, nil, connectUnauthenticated()
	}
	if a.err != nil {
		return nil, a.r, f.connectErr(a.r, a.err)
	}
	return a.sc, a.r, nil
}

func (f *Front) handleHealth(w http.ResponseWriter, r *http.Request, sc *sandboxCtx) {
	w.WriteHeader(http.StatusNoContent)
}

// workspacePath maps an E2B path onto the workspace: "~", "~/x", /home/user/x, /workspace/x and relative paths
// (E2B's default user works in its home) land under /workspace; any other absolute path is outside what the
// front serves (INVALID_PATH).
func workspacePath(p string) string {
	switch {
	case p == "" || p == "~" || p == Home:
		return ""
	case strings.HasPrefix(p, "~/"):
		return strings.TrimPrefix(p, "~/")
	case strings.HasPrefix(p, Home+"/"):
		return strings.TrimPrefix(p, Home+"/")
	}
	return p
}

// displayPath is the path E2B shows for a workspace path: under /home/user, where its programs look.
func displayPath(rel string) string {
	rel = strings.TrimPrefix(strings.TrimPrefix(rel, "/workspace"), "/")
	if rel == "" {
		return Home
	}
	return path.Join(Home, rel)
}

func (f *Front) workspace(ctx context.Context, sc *sandboxCtx, create bool) (*files.FS, error) {
	ws, err := sc.b.Workspace(ctx, sc.key, create)
	if err != nil {
		return nil, err
	}
	return ws, nil
}

func (f *Front) handleDownload(w http.ResponseWriter, r *http.Request, sc *sandboxCtx) {
	ws, err := f.workspace(r.Context(), sc, false)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	defer ws.Close()
	rc, ent, err := ws.OpenFile(workspacePath(r.URL.Query().Get("path")))
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": ent.Name}))
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, rc)
}

type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// handleUpload writes a multipart upload (each "file" part to the path query, or to its file name when no
// path is given) or an octet-stream body (to the path query).
func (f *Front) handleUpload(w http.ResponseWriter, r *http.Request, sc *sandboxCtx) {
	ws, err := f.workspace(r.Context(), sc, true)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	defer ws.Close()
	// Each file is bounded by the file limits as it is written; the body as a whole by one file's bound and
	// room for the multipart framing, so a body of many parts cannot run on without end.
	r.Body = http.MaxBytesReader(w, r.Body, ws.Limits().MaxFileBytes+1<<20)
	dest := r.URL.Query().Get("path")
	var out []writeInfo
	write := func(p string, body io.Reader) error {
		rel := workspacePath(p)
		if _, err := ws.Write(r.Context(), rel, body, 0o644); err != nil {
			return err
		}
		out = append(out, writeInfo{Name: path.Base(rel), Type: "file", Path: displayPath(rel)})
		return nil
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case mt == "multipart/form-data":
		mr := multipart.NewReader(r.Body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				f.writeError(w, r, badRequest("reading the multipart body: %v", err))
				return
			}
			if part.FormName() != "file" {
				continue
			}
			p := dest
			if p == "" {
				p = part.FileName()
			}
			if p == "" {
				f.writeError(w, r, badRequest("name the file: a path query or the part's file name"))
				return
			}
			if err := write(p, part); err != nil {
				f.writeError(w, r, err)
				return
			}
		}
	default:
		if r.Header.Get("Content-Encoding") != "" {
			f.writeError(w, r, badRequest("compressed uploads are not supported: send the file uncompressed"))
			return
		}
		if dest == "" {
			f.writeError(w, r, badRequest("name the file in the path query"))
			return
		}
		if err := write(dest, r.Body); err != nil {
			f.writeError(w, r, err)
			return
		}
	}
	if len(out) == 0 {
		f.writeError(w, r, badRequest("the upload holds no file"))
		return
	}
	writeJSON(w, http.StatusOK, out)
}
