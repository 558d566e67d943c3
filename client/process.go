package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"time"

	"github.com/sandkeep/sandkeep/wire"
)

// StartRequest starts a process: a command that outlives the call (a dev server), run beside the user's
// commands and reachable by pid or tag until it ends. Exactly one of Argv and Command is set.
type StartRequest struct {
	Argv    []string
	Command string // run as sh -c Command
	Workdir string
	Env     map[string]string
	// Lifetime bounds it: past it, its tree is killed. Zero: one hour; at most 24h. Sent in seconds.
	Lifetime time.Duration
	Stdin    bool        // keep its stdin open for Input and CloseStdin
	TTY      *WindowSize // run it on a pseudo-terminal of this size
	Tag      string      // names it, unique among the sandbox's running processes
	// BufferLimit is its output ring per stream in bytes (what a replay sends); zero: 1 MiB, at most 16 MiB.
	BufferLimit int64
	RunID       string
	RequestID   string
	Template    string
	Trust       string
}

// Process is one process of a sandbox, as the server describes it.
type Process = wire.Process

// ProcessRef names a process by its pid, or by its tag when PID is zero.
type ProcessRef struct {
	PID int
	Tag string
}

func (r ProcessRef) path(user string) (string, error) {
	ref := r.Tag
	switch {
	case r.PID > 0:
		ref = strconv.Itoa(r.PID)
	case r.Tag == "":
		return "", errors.New("client: name the process by pid or tag")
	default:
		if _, err := strconv.Atoi(r.Tag); err == nil {
			return "", fmt.Errorf("client: tag %q reads as a pid; use a tag that is not a number", r.Tag)
		}
	}
	return "/v1/sandboxes/" + escape(user) + "/processes/" + url.PathEscape(ref), nil
}

// StartProcess starts req in user's sandbox and returns once it runs, with its pid. A command that cannot start
// comes back not running, with exit 127 or 126 and StartError.
func (c *Client) StartProcess(ctx context.Context, user string, req StartRequest) (*Process, error) {
	body, err := json.Marshal(wire.ProcessStart{Argv: req.Argv, Command: req.Command, Workdir: req.Workdir, Env: req.Env,
		Lifetime: req.Lifetime.Seconds(), Stdin: req.Stdin, TTY: req.TTY, Tag: req.Tag, BufferLimit: req.BufferLimit,
		RunID: req.RunID, Template: req.Template, Trust: req.Trust})
	if err != nil {
		return nil, err
	}
	var p Process
	err = c.call(ctx, "POST", "/v1/sandboxes/"+escape(user)+"/processes", nil, bytes.NewReader(body),
		jsonHeader(ExecRequest{RequestID: req.RequestID}, "application/json"), &p)
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// Processes lists user's processes, running and recently ended.
func (c *Client) Processes(ctx context.Context, user string) ([]Process, error) {
	var out wire.ProcessList
	if err := c.call(ctx, "GET", "/v1/sandboxes/"+escape(user)+"/processes", nil, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Processes, nil
}

// AttachOptions say what ProcessOutput streams.
type AttachOptions struct {
	// Follow streams until the process ends (as `docker logs -f`); without it, only what its ring buffer holds.
	Follow bool
	// NoReplay skips the ring buffer's output when following: only what the process writes from now on (as
	// `docker attach`).
	NoReplay bool
}

// ProcessOutput writes ref's output to stdout and stderr (nil discards) and returns the process as it is when
// the stream ends: ended when following, else as it runs. Cancelling ctx ends the stream, not the process.
func (c *Client) ProcessOutput(ctx context.Context, user string, ref ProcessRef, opts AttachOptions, stdout, stderr io.Writer) (*Process, error) {
	path, err := ref.path(user)
	if err != nil {
		return nil, err
	}
	q := url.Values{"follow": {"0"}}
	if opts.Follow {
		q.Set("follow", "1")
		if opts.NoReplay {
			q.Set("replay", "0")
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := c.do(ctx, "GET", path+"/output", q, nil, map[string][]string{"Accept": {"application/x-ndjson"}})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readStream[Process](ctx, resp, stdout, stderr, "the process's output", "the process's")
}

// post sends body (JSON; nil for none) to one of ref's routes, which answer 204.
func (c *Client) post(ctx context.Context, user string, ref ProcessRef, route string, body any) error {
	path, err := ref.path(user)
	if err != nil {
		return err
	}
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	return c.call(ctx, "POST", path+"/"+route, nil, r, jsonBody(), nil)
}

// Input writes data to ref's stdin (a process started with Stdin).
func (c *Client) Input(ctx context.Context, user string, ref ProcessRef, data []byte) error {
	return c.post(ctx, user, ref, "input", wire.ProcessInput{DataB64: base64.StdEncoding.EncodeToString(data)})
}

// CloseStdin closes ref's stdin: it reads EOF.
func (c *Client) CloseStdin(ctx context.Context, user string, ref ProcessRef) error {
	return c.post(ctx, user, ref, "input", wire.ProcessInput{Close: true})
}

// Signal sends sig (as kill(1) names it: TERM, INT, HUP, 9...) to ref's process group.
func (c *Client) Signal(ctx context.Context, user string, ref ProcessRef, sig string) error {
	return c.post(ctx, user, ref, "signal", wire.ProcessSignal{Signal: sig})
}

// Kill kills ref's whole tree: SIGTERM, a grace, then SIGKILL.
func (c *Client) Kill(ctx context.Context, user string, ref ProcessRef) error {
	return c.post(ctx, user, ref, "kill", nil)
}

// Resize sets a TTY process's window size.
func (c *Client) Resize(ctx context.Context, user string, ref ProcessRef, ws WindowSize) error {
	return c.post(ctx, user, ref, "resize", ws)
}
