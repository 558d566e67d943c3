package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"math"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/wire"
)

// maxTimeoutSeconds bounds the timeout field before it becomes a time.Duration (the library's own bound,
// 24h, is checked again there); it keeps a huge number from overflowing.
const maxTimeoutSeconds = 24 * 60 * 60

// ExecBody is the JSON of POST /v1/sandboxes/{user}/exec. Exactly one of Argv and Command is set.
type ExecBody = wire.ExecRequest

// ExecNetwork is a caller's network block: for one command, a request must pass it and the run's policy both.
type ExecNetwork = wire.Network

// ExecResponse is the JSON answer of an exec: the fields of `sandkeep exec --json` and the request id.
type ExecResponse = wire.ExecResult

// decodeExec reads one exec body: one JSON object, no unknown field, nothing after it. It does no I/O besides
// reading r, so a refused body has had no effect. What the command may be is the engine's to check.
func decodeExec(r io.Reader) (sandkeep.ExecRequest, service.AdmitRequest, error) {
	var b ExecBody
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return sandkeep.ExecRequest{}, service.AdmitRequest{}, jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return sandkeep.ExecRequest{}, service.AdmitRequest{}, err
		}
		return sandkeep.ExecRequest{}, service.AdmitRequest{}, invalid("send exactly one JSON object", "the request body has data after its JSON object")
	}
	return execRequest(b)
}

// jsonError turns a decoding error into REQUEST_INVALID (or keeps a body-too-large error, which answers 413).
func jsonError(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return err
	}
	const hint = "send a JSON object; see /v1/openapi.json"
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return invalid(hint, "the request body is empty")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalid(hint, "the request body ends inside its JSON")
	case errors.As(err, &se):
		return invalid(hint, "the request body is not valid JSON at byte %d", se.Offset)
	case errors.As(err, &te):
		if te.Field != "" {
			return invalid(hint, "field %s must be a JSON %s", te.Field, jsonKind(te.Type.Kind().String()))
		}
		return invalid(hint, "the request body must be a JSON object")
	}
	// An unknown field (encoding/json has no typed error for it) and anything else: its own words name it.
	return invalid(hint, "the request body is refused: %s", strings.TrimPrefix(err.Error(), "json: "))
}

func jsonKind(k string) string {
	switch k {
	case "slice":
		return "array"
	case "map", "struct":
		return "object"
	case "float64", "int64", "int":
		return "number"
	}
	return k
}

// request turns b into the library's command and the caller's admission. It refuses only what does not decode
// (argv and command both or neither, an env name a "K=V" cannot carry, a timeout that is no number of seconds);
// the command itself is checked once, by the engine, before its run is admitted.
func execRequest(b ExecBody) (sandkeep.ExecRequest, service.AdmitRequest, error) {
	var req sandkeep.ExecRequest
	ar := service.AdmitRequest{RunID: b.RunID, Template: b.Template, Trust: b.Trust}
	switch {
	case len(b.Argv) > 0 && b.Command != "":
		return req, ar, invalid("send argv or command, not both", "the request has both argv and command")
	case len(b.Argv) > 0:
		req.Argv = b.Argv
	case b.Command != "":
		req.Argv = []string{"sh", "-c", b.Command}
	default:
		return req, ar, invalid(`send "argv": ["ls", "-l"] or "command": "ls -l"`, "the request has no command")
	}
	if len(b.Env) > 0 {
		keys := make([]string, 0, len(b.Env))
		for k := range b.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				return req, ar, fault.New(fault.InvalidEnv, "use names of letters, digits and _", "environment variable name %q is refused", k)
			}
			keys = append(keys, k)
		}
		slices.Sort(keys) // a stable order, whatever the map's
		for _, k := range keys {
			req.Env = append(req.Env, k+"="+b.Env[k])
		}
	}
	if b.Timeout < 0 || b.Timeout > maxTimeoutSeconds || math.IsNaN(b.Timeout) {
		return req, ar, fault.New(fault.InvalidTimeout, "give timeout in seconds, 1 to 86400", "timeout %g is out of range", b.Timeout)
	}
	req.Timeout = time.Duration(b.Timeout * float64(time.Second))
	req.OutputLimit = b.OutputLimit
	if b.Stdin != nil {
		req.Stdin = strings.NewReader(*b.Stdin)
	}
	req.Workdir = b.Workdir
	if n := b.Network; n != nil {
		ar.Network = &sandkeep.Network{Mode: n.Mode, Preset: n.Preset, Rules: n.Rules, Inherit: "replace"}
	}
	return req, ar, nil
}

// Streaming formats an exec answers in, chosen by the Accept header.
const (
	ctNDJSON = "application/x-ndjson"
	ctSSE    = "text/event-stream"
)

// streamFormat returns the streaming media type r accepts ("" for a plain JSON answer). The first one listed
// wins; quality values are not weighed.
func streamFormat(r *http.Request) string {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch mt {
		case ctNDJSON, ctSSE:
			return mt
		case "application/json":
			return ""
		}
	}
	return ""
}

func (s *Server) handleExec(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req, ar, err := decodeExec(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	id := infoOf(r).id
	ar.RequestID = id
	format := streamFormat(r)
	if format == "" {
		res, err := s.backend.Exec(r.Context(), key, ar, req)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		writeExecResponse(w, http.StatusOK, execResponse(res, id))
		return
	}
	st := &streamer{w: w, sse: format == ctSSE}
	req.Stdout, req.Stderr = st.writer("stdout"), st.writer("stderr")
	ar.Observer.Started = st.commit // the command runs: from here on, failures travel in the stream
	res, err := s.backend.Exec(r.Context(), key, ar, req)
	if !st.end() { // nothing sent yet: a failure still has its own status
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		st.commit()
	}
	if err != nil {
		if r.Context().Err() != nil {
			infoOf(r).clientGone = true
			return
		}
		fe, _ := s.classify(r, err)
		st.final("error", map[string]errorBody{"error": wireError(fe)})
		return
	}
	st.final("result", map[string]ExecResponse{"result": execResponse(res, id)})
}

// streamer writes an exec's output to the client as NDJSON lines or SSE events, as it is produced. The
// library may write stdout and stderr from two goroutines; mu orders them. Writes block on a slow client,
// which slows the command's output down rather than buffering it: memory stays bounded.
type streamer struct {
	w   http.ResponseWriter
	sse bool

	mu        sync.Mutex
	committed bool      // the 200 and its headers were sent
	ended     bool      // Exec returned: later writes are dropped
	broken    bool      // a write to the client failed; the request's ctx ends the command
	carry     [2][]byte // per stream, the start of a UTF-8 sequence cut by a chunk boundary
}

// chunk is one piece of output. Data holds it when it is valid UTF-8; otherwise DataB64 holds its bytes.
type chunk struct {
	Stream  string `json:"stream"`
	Data    string `json:"data,omitempty"`
	DataB64 string `json:"data_b64,omitempty"`
}

func (st *streamer) commit() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.commitLocked()
}

func (st *streamer) commitLocked() {
	if st.committed {
		return
	}
	st.committed = true
	h := st.w.Header()
	if st.sse {
		h.Set("Content-Type", ctSSE)
	} else {
		h.Set("Content-Type", ctNDJSON)
	}
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // no buffering proxy between the command and its reader
	h.Set("X-Content-Type-Options", "nosniff")
	st.w.WriteHeader(http.StatusOK)
	st.flushLocked()
}

func (st *streamer) flushLocked() {
	if err := http.NewResponseController(st.w).Flush(); err != nil {
		st.broken = true
	}
}

// end marks the command over and sends what the UTF-8 carries still hold; it reports whether the answer was
// committed.
func (st *streamer) end() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.ended = true
	for i, name := range []string{"stdout", "stderr"} {
		if len(st.carry[i]) > 0 {
			st.sendLocked(name, st.carry[i])
			st.carry[i] = nil
		}
	}
	return st.committed
}

func (st *streamer) writer(name string) io.Writer {
	i := 0
	if name == "stderr" {
		i = 1
	}
	return writerFunc(func(p []byte) (int, error) {
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.ended || len(p) == 0 {
			return len(p), nil
		}
		data := append(st.carry[i], p...)
		data, st.carry[i] = splitIncomplete(data)
		if len(data) > 0 {
			st.sendLocked(name, data)
		}
		// A client that went away is not the command's problem: its output is dropped, and the request's ctx
		// (cancelled by net/http) ends it.
		return len(p), nil
	})
}

func (st *streamer) sendLocked(name string, data []byte) {
	st.commitLocked()
	c := chunk{Stream: name}
	if utf8.Valid(data) {
		c.Data = string(data)
	} else {
		c.DataB64 = base64.StdEncoding.EncodeToString(data)
	}
	st.writeLocked(name, c)
}

func (st *streamer) final(event string, v any) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.writeLocked(event, v)
}

func (st *streamer) writeLocked(event string, v any) {
	if st.broken {
		return
	}
	line, err := json.Marshal(v)
	if err != nil {
		line = []byte(`{"error":{"code":"INTERNAL","message":"the server failed to encode a stream message","hint":""}}`)
	}
	var buf bytes.Buffer
	if st.sse {
		buf.WriteString("event: " + event + "\ndata: ")
		buf.Write(line)
		buf.WriteString("\n\n")
	} else {
		buf.Write(line)
		buf.WriteByte('\n')
	}
	if _, err := st.w.Write(buf.Bytes()); err != nil {
		st.broken = true
		return
	}
	st.flushLocked()
}

// splitIncomplete splits b before a UTF-8 sequence that its end cuts short, so that a character split across
// two writes reaches the client whole. Invalid bytes are not held back.
func splitIncomplete(b []byte) (complete, tail []byte) {
	for i := 1; i <= utf8.UTFMax-1 && i <= len(b); i++ {
		if c := b[len(b)-i]; utf8.RuneStart(c) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i], slices.Clone(b[len(b)-i:])
			}
			break
		}
	}
	return b, nil
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
