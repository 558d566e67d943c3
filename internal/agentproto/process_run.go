package agentproto

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// ProcessCall sends op on conn (a Conn of its own: Mux.Route) and returns the agent's reply. For OpAttach the
// process's output goes to stdout and stderr (either may be nil) until it ends; when ctx is done first, the
// attach is cancelled (the process runs on) and the reply, Detached set, is returned with ctx's cause. Every
// other operation is answered at once; ReportSlack bounds the wait.
//
// As with Run, a malformed or foreign frame, or a stream that ends before the reply, wraps ErrProtocol: the
// channel is broken.
func ProcessCall(ctx context.Context, conn Conn, op ProcessOp, stdout, stderr io.Writer) (ProcessReply, error) {
	if err := op.Validate(); err != nil {
		return ProcessReply{}, err
	}
	body, err := json.Marshal(op)
	if err != nil {
		return ProcessReply{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if err := WriteFrame(conn, FrameProcessOp, op.ID, body); err != nil {
		return ProcessReply{}, fmt.Errorf("%w: send process op %d: %w", ErrProtocol, op.ID, err)
	}
	frames := make(chan readItem)
	done := make(chan struct{})
	exited := make(chan struct{})
	defer func() {
		close(done)
		// The reader ends at the reply or an error; otherwise it waits in Read, which a deadline ends (conn is the
		// operation's own, so the deadline touches nothing else).
		if d, ok := conn.(interface{ SetReadDeadline(time.Time) error }); ok && d.SetReadDeadline(time.Unix(1, 0)) == nil {
			<-exited
		}
	}()
	go func() {
		defer close(exited)
		var buf []byte
		for {
			f, err := ReadFrame(conn, &buf)
			if err == nil {
				f.Payload = append([]byte(nil), f.Payload...)
			}
			select {
			case frames <- readItem{f, err}:
			case <-done:
				return
			}
			if err != nil || f.Type == FrameProcessReply {
				return
			}
		}
	}()
	var bound <-chan time.Time
	if op.Op != OpAttach {
		t := time.NewTimer(ReportSlack)
		defer t.Stop()
		bound = t.C
	}
	ctxDone := ctx.Done()
	cancelled := false
	var werr error
	write := func(w io.Writer, p []byte) {
		if w != nil && werr == nil {
			_, werr = w.Write(p)
		}
	}
	for {
		select {
		case it := <-frames:
			if it.err != nil {
				return ProcessReply{}, fmt.Errorf("process op %d: %w", op.ID, protocolErr(it.err))
			}
			f := it.f
			switch {
			case f.ID != op.ID:
				return ProcessReply{}, fmt.Errorf("%w: frame %v for %d during process op %d", ErrProtocol, f.Type, f.ID, op.ID)
			case f.Type == FrameStdout && op.Op == OpAttach:
				write(stdout, f.Payload)
			case f.Type == FrameStderr && op.Op == OpAttach:
				write(stderr, f.Payload)
			case f.Type == FrameProcessReply:
				rep, err := DecodeProcessReply(f.Payload, op.ID)
				if err != nil {
					return ProcessReply{}, err
				}
				if cancelled {
					err = context.Cause(ctx)
				}
				return rep, errors.Join(err, werr)
			default:
				return ProcessReply{}, fmt.Errorf("%w: unexpected frame %v during process op %d", ErrProtocol, f.Type, op.ID)
			}
		case <-ctxDone:
			ctxDone = nil
			if op.Op != OpAttach {
				continue // answered at once anyway; bound applies
			}
			cancelled = true
			if err := WriteFrame(conn, FrameCancel, op.ID, nil); err != nil {
				return ProcessReply{}, fmt.Errorf("%w: cancel attach %d: %w", ErrProtocol, op.ID, err)
			}
			t := time.NewTimer(ReportSlack)
			defer t.Stop()
			bound = t.C
		case <-bound:
			return ProcessReply{}, fmt.Errorf("%w: the agent did not answer process op %d within %v", ErrProtocol, op.ID, ReportSlack)
		}
	}
}
