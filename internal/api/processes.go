package api

import (
	"context"
	"encoding/base64"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/processes"
	"github.com/sandkeep/sandkeep/wire"
)

// The process routes: commands that outlive their call (a dev server), started detached, listed, followed,
// written to and signalled by pid or tag, while the user's commands run beside them.
//
//	POST /v1/sandboxes/{user}/processes                 start one (ProcessBody) -> 201 ProcessResponse
//	GET  /v1/sandboxes/{user}/processes                 list -> ProcessList
//	GET  /v1/sandboxes/{user}/processes/{ref}/output    its output as NDJSON or SSE, like a streamed exec
//	POST /v1/sandboxes/{user}/processes/{ref}/input     write to its stdin, and/or close it (InputBody)
//	POST /v1/sandboxes/{user}/processes/{ref}/signal    send a signal (SignalBody)
//	POST /v1/sandboxes/{user}/processes/{ref}/kill      kill its tree
//	POST /v1/sandboxes/{user}/processes/{ref}/resize    a TTY's window size (ResizeBody)
//
// {ref} is a pid (digits) or a tag.

// ProcessBody is the JSON of POST /v1/sandboxes/{user}/processes: an exec's command fields, and the process's.
type ProcessBody = wire.ProcessStart

// ProcessResponse is one process and the request's id.
type ProcessResponse = wire.Process

// ProcessList is the answer of GET /v1/sandboxes/{user}/processes.
type ProcessList = wire.ProcessList

// InputBody writes Data (UTF-8) or DataB64 (any bytes) to a process's stdin, then closes it when Close is set.
type InputBody = wire.ProcessInput

// SignalBody names a signal as kill(1) does: TERM, SIGINT, 9...
type SignalBody = wire.ProcessSignal

// ResizeBody is a terminal's size.
type ResizeBody = wire.WindowSize

// request turns b into the library's start request; the command's fields are read as an exec's.
func startRequest(b ProcessBody) (processes.StartRequest, error) {
	if b.Lifetime < 0 || b.Lifetime > maxTimeoutSeconds || math.IsNaN(b.Lifetime) {
		return processes.StartRequest{}, fault.New(fault.InvalidTimeout, "give lifetime in seconds, 1 to 86400", "lifetime %g is out of range", b.Lifetime)
	}
	ereq, _, err := execRequest(ExecBody{Argv: b.Argv, Command: b.Command, Workdir: b.Workdir, Env: b.Env})
	if err != nil {
		return processes.StartRequest{}, err
	}
	req := processes.StartRequest{Argv: ereq.Argv, Workdir: ereq.Workdir, Env: ereq.Env,
		Lifetime: time.Duration(b.Lifetime * float64(time.Second)), Stdin: b.Stdin, Tag: b.Tag, BufferLimit: b.BufferLimit,
		RunID: b.RunID, Template: b.Template, Trust: b.Trust}
	if b.TTY != nil {
		req.TTY = &sandkeep.WindowSize{Rows: b.TTY.Rows, Cols: b.TTY.Cols}
	}
	return req, nil
}

// refOf reads {ref}: a pid when it is all digits, else a tag.
func refOf(r *http.Request) (processes.Ref, error) {
	s := r.PathValue("ref")
	if s == "" {
		return processes.Ref{}, invalid("name the process by pid or tag", "no process named")
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 {
			return processes.Ref{}, invalid("name the process by pid or tag", "pid %d is out of range", n)
		}
		return processes.Ref{PID: n}, nil
	}
	return processes.Ref{Tag: s}, nil
}

func (s *Server) processes() service.ProcessBackend { return s.backend.(service.ProcessBackend) }

func (s *Server) handleStartProcess(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var b ProcessBody
	if err := decodeStrict(http.MaxBytesReader(w, r.Body, s.maxBody), &b, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	req, err := startRequest(b)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req.RequestID = infoOf(r).id
	p, err := s.processes().StartProcess(r.Context(), key, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, wireProcess(p, req.RequestID))
}

func (s *Server) handleProcesses(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := checkQuery(r.URL.Query()); err != nil {
		s.writeError(w, r, err)
		return
	}
	ps, err := s.processes().Processes(r.Context(), key)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if ps == nil {
		ps = []processes.Process{}
	}
	writeJSON(w, http.StatusOK, ProcessList{Processes: wireProcesses(ps)})
}

// boolQuery reads a query flag: 1/true or 0/false; def when absent.
func boolQuery(r *http.Request, name string, def bool) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, invalid("give "+name+"=1 or "+name+"=0", "query %s=%q is not a boolean", name, v)
	}
	return b, nil
}

// handleProcessOutput streams a process's output as a streamed exec does (NDJSON, or SSE when asked), then a
// final result event with the process. follow=0 sends what its ring holds and ends (as `docker logs`);
// replay=0 skips the ring (as `docker attach`). Leaving ends the stream, not the process.
func (s *Server) handleProcessOutput(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ref, err := refOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	follow, err := boolQuery(r, "follow", true)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	replay, err := boolQuery(r, "replay", true)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	st := &streamer{w: w, sse: streamFormat(r) == ctSSE}
	opts := processes.AttachOptions{Stdout: st.writer("stdout"), Stderr: st.writer("stderr"), Replay: replay || !follow, Snapshot: !follow}
	p, err := s.processes().AttachProcess(r.Context(), key, ref, opts)
	if !st.end() {
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
	st.final("result", map[string]ProcessResponse{"result": wireProcess(p, infoOf(r).id)})
}

// processCall is the shape of the routes that act on one process and answer 204.
func (s *Server) processCall(w http.ResponseWriter, r *http.Request, body any,
	act func(ctx context.Context, pb service.ProcessBackend, key sandkeep.Key, ref processes.Ref) error) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ref, err := refOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if body != nil {
		if err := decodeStrict(http.MaxBytesReader(w, r.Body, s.maxBody), body, false); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	if err := act(r.Context(), s.processes(), key, ref); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleProcessInput(w http.ResponseWriter, r *http.Request) {
	var b InputBody
	s.processCall(w, r, &b, func(ctx context.Context, pb service.ProcessBackend, key sandkeep.Key, ref processes.Ref) error {
		data := []byte(b.Data)
		if b.DataB64 != "" {
			if b.Data != "" {
				return invalid("send data or data_b64, not both", "the request has both data and data_b64")
			}
			var err error
			if data, err = base64.StdEncoding.DecodeString(b.DataB64); err != nil {
				return invalid("encode data_b64 as standard base64", "data_b64 is not base64: %v", err)
			}
		}
		if len(data) == 0 && !b.Close {
			return invalid(`send "data", "data_b64" or "close": true`, "the request writes nothing")
		}
		if len(data) > 0 {
			if err := pb.SendInput(ctx, key, ref, data); err != nil {
				return err
			}
		}
		if b.Close {
			return pb.CloseStdin(ctx, key, ref)
		}
		return nil
	})
}

func (s *Server) handleProcessSignal(w http.ResponseWriter, r *http.Request) {
	var b SignalBody
	s.processCall(w, r, &b, func(ctx context.Context, pb service.ProcessBackend, key sandkeep.Key, ref processes.Ref) error {
		sig, err := processes.ParseSignal(b.Signal)
		if err != nil {
			return err
		}
		return pb.SignalProcess(ctx, key, ref, sig)
	})
}

func (s *Server) handleProcessKill(w http.ResponseWriter, r *http.Request) {
	s.processCall(w, r, nil, func(ctx context.Context, pb service.ProcessBackend, key sandkeep.Key, ref processes.Ref) error {
		return pb.KillProcess(ctx, key, ref)
	})
}

func (s *Server) handleProcessResize(w http.ResponseWriter, r *http.Request) {
	var b ResizeBody
	s.processCall(w, r, &b, func(ctx context.Context, pb service.ProcessBackend, key sandkeep.Key, ref processes.Ref) error {
		return pb.ResizeProcess(ctx, key, ref, sandkeep.WindowSize{Rows: b.Rows, Cols: b.Cols})
	})
}
