package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// ToolError is the structured content of a failed tool call, and the body of a refused HTTP request.
type ToolError struct {
	Code    fault.Code `json:"code"`
	Message string     `json:"message"`
	Hint    string     `json:"hint,omitempty"`
}

// String is the failure as a model reads it: "CODE: message (hint: ...)".
func (e ToolError) String() string {
	s := string(e.Code) + ": " + e.Message
	if e.Hint != "" {
		s += " (hint: " + e.Hint + ")"
	}
	return s
}

// toolErrorOf describes err. Tool handlers return only *fault.Error (see handle), so any other error comes from
// the SDK checking the arguments against the input schema: the caller's mistake.
func toolErrorOf(err error) ToolError {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return ToolError{Code: fe.Code, Message: fe.Message, Hint: fe.Hint}
	}
	return ToolError{Code: fault.InvalidArgument, Message: err.Error(),
		Hint: "fix the arguments to match the tool's input schema (see tools/list)"}
}

// ErrorMetaKey is the _meta key of a failed tool call's {code, message, hint}.
const ErrorMetaKey = "sandkeep/error"

// toolErrors renders every failed tool call as "CODE: message (hint: ...)" text, with {code, message, hint} in
// _meta under ErrorMetaKey. Not as structured content: a tool's structured content must match its declared output
// schema, and clients validate it (the official TypeScript client throws on a mismatch instead of handing the
// error to the model), so an error result carries none. The SDK puts a handler's error into the result (IsError,
// GetError) but only as plain text, so this is done after it, on the way out.
func toolErrors(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if err != nil || method != "tools/call" {
			return res, err
		}
		r, ok := res.(*mcp.CallToolResult)
		if !ok || !r.IsError || r.GetError() == nil {
			return res, err
		}
		te := toolErrorOf(r.GetError())
		r.Content = []mcp.Content{&mcp.TextContent{Text: te.String()}}
		r.StructuredContent = nil
		if r.Meta == nil {
			r.Meta = mcp.Meta{}
		}
		r.Meta[ErrorMetaKey] = te
		return r, nil
	}
}

// writeHTTPError refuses an HTTP request with JSON {code, message, hint} and the status that fits its code. An
// error without a code is a bug in the caller's keyFor; its text is not shown.
func writeHTTPError(w http.ResponseWriter, err error) {
	te := ToolError{Code: fault.Internal, Message: "the server could not tell which sandbox this request is for",
		Hint: "report it with the server's log"}
	var fe *fault.Error
	if errors.As(err, &fe) {
		te = ToolError{Code: fe.Code, Message: fe.Message, Hint: fe.Hint}
	}
	status := httpStatus(te.Code)
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sandkeep"`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(te)
}

// httpStatus is the status for a refusal with code: the codes keyFor is expected to return, then 400 for the
// other codes (they describe the request) and 500 for INTERNAL.
func httpStatus(code fault.Code) int {
	switch code {
	case fault.Unauthenticated:
		return http.StatusUnauthorized
	case fault.Forbidden:
		return http.StatusForbidden
	case fault.NotFound:
		return http.StatusNotFound
	case fault.RequestTooLarge:
		return http.StatusRequestEntityTooLarge
	case fault.RateLimited:
		return http.StatusTooManyRequests
	case fault.ShuttingDown, fault.StoreUnavailable:
		return http.StatusServiceUnavailable
	case fault.Internal:
		return http.StatusInternalServerError
	}
	return http.StatusBadRequest
}
