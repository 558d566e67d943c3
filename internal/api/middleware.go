package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// RequestIDHeader carries the request id both ways.
const RequestIDHeader = "X-Request-Id"

// reqInfo is what the layers of one request tell the access log. It is written by the request's own
// goroutine only (the handler runs on it), so it needs no lock.
type reqInfo struct {
	id         string
	route      string // the ServeMux pattern; "" for no route
	tenant     string
	tokenID    string
	code       fault.Code // of an error answer
	clientGone bool       // the client left before its answer (logged as 499)
}

type infoKey struct{}

// infoOf returns r's reqInfo; outside serve (a handler called directly) a throwaway one.
func infoOf(r *http.Request) *reqInfo {
	if i, ok := r.Context().Value(infoKey{}).(*reqInfo); ok {
		return i
	}
	return &reqInfo{}
}

// requestIDFrom returns the request id of a request's context ("" outside serve).
func requestIDFrom(ctx context.Context) string {
	if i, ok := ctx.Value(infoKey{}).(*reqInfo); ok {
		return i.id
	}
	return ""
}

// saneRequestID reports whether an incoming request id may be used as is: 1..128 characters of
// [A-Za-z0-9._:-]. Anything else is replaced, so logs and events never carry a client's arbitrary bytes.
func saneRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return "req_" + hex.EncodeToString(b[:])
}

// serve is the outermost layer: the request id, then the route, then one access log line and the request
// metrics.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id := r.Header.Get(RequestIDHeader)
	if !saneRequestID(id) {
		id = newRequestID()
	}
	info := &reqInfo{id: id}
	r = r.WithContext(context.WithValue(r.Context(), infoKey{}, info))
	w.Header().Set(RequestIDHeader, id)
	rec := &recorder{ResponseWriter: w}
	aborted := true
	defer func() {
		// Also on a panic (http.ErrAbortHandler ends a broken download): log it, then let net/http handle it.
		s.finish(r, info, rec, start, aborted)
	}()
	s.mux.ServeHTTP(rec, r)
	aborted = false
}

func (s *Server) finish(r *http.Request, info *reqInfo, rec *recorder, start time.Time, aborted bool) {
	status := rec.status
	switch {
	case info.clientGone || (aborted && r.Context().Err() != nil):
		status = 499 // the client closed the request (nginx's convention)
	case aborted:
		status = 0 // the answer was cut off on purpose
	case status == 0:
		status = http.StatusOK
	}
	route := info.route
	if route == "" {
		route = "unmatched"
	}
	d := time.Since(start)
	s.metrics.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	s.metrics.requestDuration.WithLabelValues(route).Observe(d.Seconds())
	attrs := []slog.Attr{
		slog.String("method", r.Method), slog.String("route", route), slog.String("path", r.URL.Path),
		slog.Int("status", status), slog.Int64("bytes", rec.bytes), slog.Float64("duration_ms", float64(d.Microseconds())/1000),
		slog.String("request_id", info.id), slog.String("remote", r.RemoteAddr),
	}
	if info.tenant != "" {
		attrs = append(attrs, slog.String("tenant", info.tenant), slog.String("token_id", info.tokenID))
	}
	if info.code != "" {
		attrs = append(attrs, slog.String("code", string(info.code)))
	}
	if aborted {
		attrs = append(attrs, slog.Bool("aborted", true))
	}
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
}

// recorder notes the status and size of an answer. It passes Flush through, and Unwrap lets
// http.ResponseController reach the connection's other controls.
type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

func (w *recorder) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
