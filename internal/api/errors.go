package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/wire"
)

// statusOf is the one table from failure code to HTTP status. A code missing here answers 500; the test
// TestEveryCodeHasAStatus parses internal/fault so that a new code cannot be forgotten.
//
// 400 means "fix the request" (its fields); 422 means "the request is fine, but the operator's spec or policy
// refuses it"; 503 means "retrying later, or elsewhere, may help".
var statusOf = map[fault.Code]int{
	// The request itself is wrong.
	fault.InvalidArgument: http.StatusBadRequest,
	fault.InvalidEnv:      http.StatusBadRequest,
	fault.InvalidIdentity: http.StatusBadRequest,
	fault.InvalidTimeout:  http.StatusBadRequest,
	fault.InvalidWorkdir:  http.StatusBadRequest,
	fault.InvalidPath:     http.StatusBadRequest,
	fault.RequestInvalid:  http.StatusBadRequest,

	fault.Unauthenticated: http.StatusUnauthorized,
	fault.Forbidden:       http.StatusForbidden,

	fault.NotFound:      http.StatusNotFound,
	fault.RunNotFound:   http.StatusNotFound,
	fault.UploadTooSlow: http.StatusRequestTimeout,
	fault.FileNotFound:  http.StatusNotFound,

	fault.ProcessNotFound:    http.StatusNotFound,
	fault.ProcessExited:      http.StatusConflict,
	fault.ProcessUnavailable: http.StatusUnprocessableEntity,

	fault.SandboxBusy:       http.StatusConflict,
	fault.SandboxNotRunning: http.StatusConflict,
	fault.PathConflict:      http.StatusConflict,
	fault.FileType:          http.StatusConflict,
	fault.SandboxExists:     http.StatusConflict,

	fault.SnapshotNotFound: http.StatusNotFound,
	fault.SnapshotExists:   http.StatusConflict,
	fault.QuotaExceeded:    http.StatusInsufficientStorage,

	fault.RequestTooLarge: http.StatusRequestEntityTooLarge,
	fault.FileTooLarge:    http.StatusRequestEntityTooLarge,

	// Policy and the operator's spec refuse a well-formed request.
	fault.SpecInvalid:             http.StatusUnprocessableEntity,
	fault.SpecUnsupported:         http.StatusUnprocessableEntity,
	fault.PostureRefused:          http.StatusUnprocessableEntity,
	fault.UntrustedWithoutSandbox: http.StatusUnprocessableEntity,
	fault.InvalidMount:            http.StatusUnprocessableEntity,
	fault.NetworkInvalid:          http.StatusUnprocessableEntity,
	fault.BuildContextInvalid:     http.StatusUnprocessableEntity,
	fault.SecretUnavailable:       http.StatusUnprocessableEntity,
	fault.SecretsNeedSandbox:      http.StatusUnprocessableEntity,
	fault.PreflightFailed:         http.StatusUnprocessableEntity,
	fault.TierRefused:             http.StatusUnprocessableEntity,
	fault.PortForwardUnavailable:  http.StatusUnprocessableEntity,
	fault.LocalPortInUse:          http.StatusConflict, // the CLI's; no route answers it
	fault.FilesUnavailable:        http.StatusUnprocessableEntity,
	fault.FeatureInvalid:          http.StatusUnprocessableEntity,
	fault.ComposeInvalid:          http.StatusUnprocessableEntity,
	fault.NetworkWidened:          http.StatusForbidden,
	fault.TemplateNotFound:        http.StatusNotFound,

	fault.RateLimited: http.StatusTooManyRequests,

	fault.WorkspaceFull: http.StatusInsufficientStorage,

	// Something this server depends on is not there now; retrying later or on another instance may help.
	fault.DriverUnavailable:        http.StatusServiceUnavailable,
	fault.SandboxDriverUnavailable: http.StatusServiceUnavailable,
	fault.StoreUnavailable:         http.StatusServiceUnavailable,
	fault.ShuttingDown:             http.StatusServiceUnavailable,
	fault.TransportUnavailable:     http.StatusServiceUnavailable,
	fault.EgressUnavailable:        http.StatusServiceUnavailable,
	fault.NetworkUnenforced:        http.StatusServiceUnavailable,
	fault.SandboxCapacity:          http.StatusServiceUnavailable,
	fault.KeyLimit:                 http.StatusServiceUnavailable,
	fault.SandboxSetupTimeout:      http.StatusServiceUnavailable,
	fault.FeatureUnavailable:       http.StatusServiceUnavailable, // its registry cannot be reached now
	// The local daemon's codes are the CLI's; a server that meets one (it never should) says so as unavailable.
	fault.DaemonUnavailable: http.StatusServiceUnavailable,
	fault.DaemonMismatch:    http.StatusServiceUnavailable,
	fault.DaemonLost:        http.StatusServiceUnavailable,
	fault.OwnerUnavailable:  http.StatusServiceUnavailable,
	fault.OwnerLost:         http.StatusBadGateway,
	fault.HomeOwned:         http.StatusServiceUnavailable,

	// The server, the engine or the sandbox failed.
	fault.Internal:             http.StatusInternalServerError,
	fault.CallerFailed:         http.StatusConflict, // a run's recorded outcome, never a request's error; 409 if one ever is
	fault.AgentMissing:         http.StatusInternalServerError,
	fault.AgentProtocol:        http.StatusInternalServerError,
	fault.ForeignContainer:     http.StatusInternalServerError,
	fault.ImageUnavailable:     http.StatusInternalServerError,
	fault.SandboxFailed:        http.StatusInternalServerError,
	fault.BuildFailed:          http.StatusInternalServerError,
	fault.PostCreateFailed:     http.StatusInternalServerError,
	fault.SecretDeliveryFailed: http.StatusInternalServerError,
	fault.CompanionFailed:      http.StatusInternalServerError,
	fault.PortUnreachable:      http.StatusBadGateway,
}

// errorBody is the JSON of every error answer.
type errorBody = wire.Error

// httpError is a failure with a status fixed by the API itself rather than by the table: an unknown route (404)
// or method (405), which have no failure code of their own.
type httpError struct {
	status int
	fe     *fault.Error
}

func (e *httpError) Error() string { return e.fe.Error() }
func (e *httpError) Unwrap() error { return e.fe }

// retryAfter, when an error carries it, sets the Retry-After header (seconds) of a 429.
type retryAfter interface{ RetryAfterSeconds() int }

// limitError is a 429 with its Retry-After.
type limitError struct {
	fe      *fault.Error
	seconds int
}

func (e *limitError) Error() string          { return e.fe.Error() }
func (e *limitError) Unwrap() error          { return e.fe }
func (e *limitError) RetryAfterSeconds() int { return e.seconds }

// toFault turns any error into the *fault.Error the client sees and its status. An error that is not a
// *fault.Error is a bug or an unclassified failure: the client sees INTERNAL, never its text (it may name host
// paths or engine details), and the log has the cause.
func toFault(err error) (*fault.Error, int) {
	var he *httpError
	if errors.As(err, &he) {
		return he.fe, he.status
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) { // a body past its bound, whoever was reading it
		return fault.New(fault.RequestTooLarge, "send a smaller body, or ask the operator to raise the bound",
			"the request body is larger than %d bytes", mbe.Limit), http.StatusRequestEntityTooLarge
	}
	var fe *fault.Error
	if !errors.As(err, &fe) {
		return fault.New(fault.Internal, "retry; if it persists, report it with the request id",
			"the server failed to handle the request"), http.StatusInternalServerError
	}
	status, ok := statusOf[fe.Code]
	if !ok {
		status = http.StatusInternalServerError
	}
	return fe, status
}

// writeError answers err as JSON {code, message, hint} with its status. A request whose client went away gets
// no answer (there is nobody to read it); the access log records 499.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil && errors.Is(err, context.Canceled) {
		infoOf(r).clientGone = true
		return
	}
	fe, status := s.classify(r, err)
	h := w.Header()
	switch status {
	case http.StatusUnauthorized:
		h.Set("WWW-Authenticate", `Bearer realm="sandkeep"`)
	case http.StatusTooManyRequests:
		secs := 1
		var ra retryAfter
		if errors.As(err, &ra) && ra.RetryAfterSeconds() > 0 {
			secs = ra.RetryAfterSeconds()
		}
		h.Set("Retry-After", strconv.Itoa(secs))
	case http.StatusServiceUnavailable:
		if fe.Code == fault.ShuttingDown {
			h.Set("Connection", "close") // send the client's next request to another instance
		}
	}
	writeJSON(w, status, wireError(fe))
}

// classify is toFault for an answer to r: it notes the code for the access log, and logs the cause of a 5xx,
// which the client does not see.
func (s *Server) classify(r *http.Request, err error) (*fault.Error, int) {
	fe, status := toFault(err)
	infoOf(r).code = fe.Code
	if status >= 500 {
		s.log.LogAttrs(r.Context(), slog.LevelError, "request failed", slog.String("request_id", infoOf(r).id),
			slog.String("code", string(fe.Code)), slog.String("error", err.Error()))
	}
	return fe, status
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // a client that went away is not an error of ours
}

// invalid is a REQUEST_INVALID failure: malformed JSON, an unknown field, a bad parameter.
func invalid(hint, format string, args ...any) *fault.Error {
	return fault.New(fault.RequestInvalid, hint, format, args...)
}
