package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"connectrpc.com/connect"
)

// statusError is an answer of the front's own (not a sandkeep fault): a status and a message.
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return e.msg }

func notFound(id string) error {
	return &statusError{status: http.StatusNotFound, msg: fmt.Sprintf("sandbox %q not found", id)}
}

func badRequest(format string, a ...any) error {
	return &statusError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, a...)}
}

// status is the HTTP status and message err is answered with: a fault's status as the API maps it (its code
// and hint folded into the message), or the front's own.
func (f *Front) status(r *http.Request, err error) (int, string) {
	var se *statusError
	if errors.As(err, &se) {
		return se.status, se.msg
	}
	if errors.Is(err, errNoRecord) {
		return http.StatusNotFound, "sandbox not found"
	}
	_, hooks := f.backend()
	fe, st := hooks.Status(r, err)
	msg := fe.Message
	if fe.Code != "" {
		msg = string(fe.Code) + ": " + msg
	}
	if fe.Hint != "" {
		msg += " (" + fe.Hint + ")"
	}
	return st, msg
}

// writeError answers err in E2B's shape, {"code": <status>, "message": "..."}, which the SDK turns into its
// typed errors (401 AuthenticationError, 404 NotFoundError, 429 RateLimitError, ...).
func (f *Front) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil && errors.Is(err, context.Canceled) {
		return
	}
	st, msg := f.status(r, err)
	if st == http.StatusTooManyRequests { // the limit's own wait when it says (the SDK retries after it)
		secs := 1
		var ra interface{ RetryAfterSeconds() int }
		if errors.As(err, &ra) && ra.RetryAfterSeconds() > 0 {
			secs = ra.RetryAfterSeconds()
		}
		w.Header().Set("Retry-After", strconv.Itoa(secs))
	}
	writeJSON(w, st, map[string]any{"code": st, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// connectErr turns err into the Connect error the SDK maps onto its typed errors (NotFound NotFoundError,
// Unauthenticated AuthenticationError, ResourceExhausted RateLimitError, DeadlineExceeded TimeoutError).
func (f *Front) connectErr(r *http.Request, err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	if errors.Is(err, context.Canceled) {
		return connect.NewError(connect.CodeCanceled, err)
	}
	st, msg := f.status(r, err)
	return connect.NewError(codeOf(st), errors.New(msg))
}

func codeOf(status int) connect.Code {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return connect.CodeInvalidArgument
	case http.StatusUnauthorized:
		return connect.CodeUnauthenticated
	case http.StatusForbidden:
		return connect.CodePermissionDenied
	case http.StatusNotFound:
		return connect.CodeNotFound
	case http.StatusConflict:
		return connect.CodeFailedPrecondition
	case http.StatusTooManyRequests:
		return connect.CodeResourceExhausted
	case http.StatusRequestTimeout, http.StatusGatewayTimeout:
		return connect.CodeDeadlineExceeded
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return connect.CodeUnavailable
	case http.StatusNotImplemented:
		return connect.CodeUnimplemented
	}
	return connect.CodeInternal
}

func connectUnauthenticated() error {
	return connect.NewError(connect.CodeUnauthenticated, errors.New("the call was not authenticated"))
}
