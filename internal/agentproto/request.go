package agentproto

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"
)

// DefaultGraceMS is the grace between SIGTERM and SIGKILL when a Request leaves GraceMS at 0.
const DefaultGraceMS = 2000

// ErrBadRequest marks a Request that the host must not send and the agent refuses.
var ErrBadRequest = errors.New("invalid agent request")

// Validate checks what both sides rely on: the version, a non-empty argv, an absolute workdir (or none: the
// agent's own), "K=V" env entries, a positive timeout, a grace that is not negative, and limits in
// 1..MaxOutputLimit (stdout: 1..MaxStreamLimit for a Stream request).
func (r *Request) Validate() error {
	stdoutMax, stderrMax := int64(MaxOutputLimit), int64(MaxOutputLimit)
	if r.Stream || r.Bounded {
		stdoutMax = MaxStreamLimit
	}
	if r.Bounded {
		stderrMax = MaxStreamLimit
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, a...))
	}
	switch {
	case r.Version != Version:
		return bad("protocol version %d, want %d", r.Version, Version)
	case len(r.Argv) == 0 || r.Argv[0] == "":
		return bad("empty argv")
	case r.Workdir != "" && !path.IsAbs(r.Workdir):
		return bad("workdir %q is not absolute", r.Workdir)
	case r.TimeoutMS <= 0:
		return bad("timeout %dms is not positive", r.TimeoutMS)
	case r.GraceMS < 0:
		return bad("grace %dms is negative", r.GraceMS)
	case r.StdoutLimit <= 0 || r.StdoutLimit > stdoutMax:
		return bad("stdout limit %d outside 1..%d", r.StdoutLimit, stdoutMax)
	case r.StderrLimit <= 0 || r.StderrLimit > stderrMax:
		return bad("stderr limit %d outside 1..%d", r.StderrLimit, stderrMax)
	}
	if d := r.Detach; d != nil {
		if err := CheckTag(d.Tag); err != nil {
			return err
		}
		if d.Ring < 0 || d.Ring > MaxRing {
			return bad("ring buffer %d outside 0..%d", d.Ring, MaxRing)
		}
	}
	if r.TTY != nil {
		if err := r.TTY.Check(); err != nil {
			return err
		}
	}
	for _, kv := range r.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return bad("env entry %q is not K=V", kv)
		}
	}
	return nil
}

// Grace returns the time between SIGTERM and SIGKILL for this request.
func (r *Request) Grace() time.Duration {
	if r.GraceMS == 0 {
		return DefaultGraceMS * time.Millisecond
	}
	return time.Duration(r.GraceMS) * time.Millisecond
}

// Timeout returns the command's deadline, counted from when the agent receives the request.
func (r *Request) Timeout() time.Duration { return time.Duration(r.TimeoutMS) * time.Millisecond }

// DecodeResult parses an 'R' payload for the command id and checks it: the ID, an exit code in 0..255, a signal
// consistent with it, a duration that is not negative. Anything else wraps ErrProtocol.
func DecodeResult(payload []byte, id uint32) (Result, error) {
	var res Result
	if err := json.Unmarshal(payload, &res); err != nil {
		return Result{}, fmt.Errorf("%w: result: %w", ErrProtocol, err)
	}
	switch {
	case res.ID != id:
		return Result{}, fmt.Errorf("%w: result for command %d, want %d", ErrProtocol, res.ID, id)
	case res.ExitCode < 0 || res.ExitCode > 255:
		return Result{}, fmt.Errorf("%w: exit code %d outside 0..255", ErrProtocol, res.ExitCode)
	case res.Signal < 0 || res.Signal > 127 || (res.Signal != 0 && res.ExitCode != 128+res.Signal):
		return Result{}, fmt.Errorf("%w: signal %d with exit code %d", ErrProtocol, res.Signal, res.ExitCode)
	case res.DurationMS < 0:
		return Result{}, fmt.Errorf("%w: negative duration", ErrProtocol)
	case res.PID < 0:
		return Result{}, fmt.Errorf("%w: negative pid", ErrProtocol)
	}
	return res, nil
}
