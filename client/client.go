// Package client is the Go SDK of sandkeep's HTTP API (`sandkeep serve`): run commands, stream their output,
// move files and read runs and events in a tenant's sandboxes, with the token of that tenant.
//
//	c, err := client.New("https://sandkeep.internal:7878", os.Getenv("SANDKEEP_TOKEN"))
//	res, err := c.Exec(ctx, "alice", client.ExecRequest{Command: "make test", Timeout: 5 * time.Minute})
//
// Failures the server reports come back as *APIError, which unwraps to the *sandkeep.Error the server sent:
// sandkeep.CodeOf(err) and errors.As work as with the library. The package does not import the library itself,
// so a program that only calls the API does not link the container engine's client.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/wire"
)

// Client calls one sandkeep server with one token. It is safe for concurrent use.
type Client struct {
	base      *url.URL
	token     string
	hc        *http.Client
	userAgent string
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests with hc (for TLS settings, a proxy, a transport). Do not
// set hc.Timeout: a command may stream for hours; bound each call with its ctx instead.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithUserAgent sets the User-Agent of every request.
func WithUserAgent(ua string) Option { return func(c *Client) { c.userAgent = ua } }

// New returns a Client for the server at baseURL (scheme, host and an optional path prefix) with token, a
// tenant's API token (`sandkeep token create`).
func New(baseURL, token string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q: want http(s)://host[:port][/prefix]", baseURL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	c := &Client{base: u, token: token, hc: http.DefaultClient, userAgent: "sandkeep-go-client"}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Wire types shared with the server. They are the types the server encodes, so the two cannot drift.
type (
	// Run is one admitted (or refused) unit of work: mode, driver, admission, status, failure code.
	Run = store.Run
	// Event is one recorded fact of a run; Payload is its JSON (see docs/EVENTS.md).
	Event = events.Event
	// Entry is one file of a listing. Target is a symlink's target, as data.
	Entry = files.Entry
	// TarSummary says what a tar upload wrote.
	TarSummary = files.TarSummary
)

// ExecRequest is one command. Exactly one of Argv and Command is set.
type ExecRequest struct {
	Argv        []string          // run directly, without a shell
	Command     string            // run as sh -c Command
	Workdir     string            // relative to /workspace, or absolute under it; created when missing
	Env         map[string]string // added to the sandbox's environment
	Timeout     time.Duration     // 1s..24h; zero means the server's default (120s); sent in seconds
	Stdin       string            // the command's standard input; empty: it reads nothing
	OutputLimit int64             // bytes kept per stream; zero means 1 MiB
	RunID       string            // attach to a running run of the same tenant and user
	RequestID   string            // sent as X-Request-Id (1..128 of [A-Za-z0-9._:-]); empty: the server makes one
	// Template and Trust are what the command's own run is admitted with (without RunID): one of the operator's
	// templates (Templates lists them; "" the tenant's default) and "untrusted" to lower the token's trust.
	Template string
	Trust    string
	// Network narrows the run's network for this command (mode none, or an allowlist within the template's:
	// a request must pass both).
	Network *Network
}

// Network is a caller's network block: it may only narrow the template's (NETWORK_WIDENED otherwise).
type Network = wire.Network

func (r ExecRequest) toWire() wire.ExecRequest {
	w := wire.ExecRequest{Argv: r.Argv, Command: r.Command, Workdir: r.Workdir, Env: r.Env, Timeout: r.Timeout.Seconds(),
		OutputLimit: r.OutputLimit, RunID: r.RunID, Template: r.Template, Trust: r.Trust, Network: r.Network}
	if r.Stdin != "" {
		w.Stdin = &r.Stdin
	}
	return w
}

func (r ExecRequest) body() ([]byte, error) { return json.Marshal(r.toWire()) }

// ExecResult is the outcome of one command: the fields of `sandkeep exec --json`, and the request id.
type ExecResult = wire.ExecResult

// SandboxRef names the sandbox a command ran in.
type SandboxRef = wire.SandboxRef

// Sandbox describes one sandbox, as `sandkeep ps` shows it.
type Sandbox = wire.Sandbox

// DiskUsage is a workspace quota's use, in bytes and inodes, and its limits.
type DiskUsage = wire.DiskUsage

// APIError is a failure the server answered. It unwraps to the *sandkeep.Error (a *fault.Error) with the
// server's Code, Message and Hint.
type APIError struct {
	Status     int           // the HTTP status; 200 when the error ended a streamed exec
	RequestID  string        // the server's request id: quote it when reporting a problem
	RetryAfter time.Duration // with 429 and 503, how long the server asks to wait; zero when it did not say
	Err        *fault.Error
}

// Error is the server's code, message and hint.
func (e *APIError) Error() string { return e.Err.Error() }

// Unwrap returns the *sandkeep.Error.
func (e *APIError) Unwrap() error { return e.Err }

// errorBody is the JSON of an error answer.
type errorBody = wire.Error

func faultOf(b errorBody) *fault.Error {
	return &fault.Error{Code: fault.Code(b.Code), Message: b.Message, Hint: b.Hint}
}

// apiError reads a failure answer. A body that is not the server's JSON (a proxy's page, net/http's 431)
// still gets a code, from its status.
func apiError(resp *http.Response) error {
	e := &APIError{Status: resp.StatusCode, RequestID: resp.Header.Get("X-Request-Id")}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var b errorBody
	if json.Unmarshal(raw, &b) == nil && b.Code != "" {
		e.Err = faultOf(b)
		return e
	}
	code := fault.Internal
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		code = fault.Unauthenticated
	case http.StatusForbidden:
		code = fault.Forbidden
	case http.StatusRequestEntityTooLarge, http.StatusRequestHeaderFieldsTooLarge:
		code = fault.RequestTooLarge
	case http.StatusTooManyRequests:
		code = fault.RateLimited
	}
	text := strings.TrimSpace(string(raw))
	if len(text) > 200 {
		text = text[:200]
	}
	e.Err = fault.New(code, "check the base URL and that a sandkeep server answers there",
		"the server answered %s: %q", resp.Status, text)
	return e
}

// escape turns a path parameter into one URL segment: slashes included (%2F), so that the server's router
// neither cleans ".." away nor redirects; the server judges the path itself.
func escape(p string) string {
	s := url.PathEscape(p)
	if s == "." || s == ".." {
		s = strings.ReplaceAll(s, ".", "%2E")
	}
	return s
}

// do sends one request and returns a 2xx answer; anything else is an *APIError.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body io.Reader, hdr http.Header) (*http.Response, error) {
	u := *c.base
	u.RawPath = c.base.EscapedPath() + path
	p, err := url.PathUnescape(u.RawPath)
	if err != nil {
		return nil, fmt.Errorf("client: path %q: %w", path, err)
	}
	u.Path = p
	if len(query) > 0 {
		u.RawQuery = query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("User-Agent", c.userAgent)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, apiError(resp)
	}
	return resp, nil
}

// call sends a request and decodes its JSON answer into v (nil: the answer is dropped).
func (c *Client) call(ctx context.Context, method, path string, query url.Values, body io.Reader, hdr http.Header, v any) error {
	resp, err := c.do(ctx, method, path, query, body, hdr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if v == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("client: decode the answer of %s %s: %w", method, path, err)
	}
	return nil
}

func jsonHeader(req ExecRequest, accept string) http.Header {
	h := http.Header{"Content-Type": {"application/json"}, "Accept": {accept}}
	if req.RequestID != "" {
		h.Set("X-Request-Id", req.RequestID)
	}
	return h
}

// Exec runs one command in user's sandbox and returns its result with the output collected. A non-zero exit
// status is a result, not an error. Cancelling ctx cancels the command (its process tree is killed).
func (c *Client) Exec(ctx context.Context, user string, req ExecRequest) (*ExecResult, error) {
	body, err := req.body()
	if err != nil {
		return nil, err
	}
	var res ExecResult
	err = c.call(ctx, "POST", "/v1/sandboxes/"+escape(user)+"/exec", nil, bytes.NewReader(body),
		jsonHeader(req, "application/json"), &res)
	if err != nil {
		return nil, err
	}
	return &res, nil
}

// streamFrame is one NDJSON line of a streamed answer (an exec's, a process's output): a chunk of stdout or
// stderr, or the end, a result R or an error.
type streamFrame[R any] struct {
	Stream  string     `json:"stream"`
	Data    *string    `json:"data"`
	DataB64 []byte     `json:"data_b64"` // encoding/json decodes base64 into []byte
	Result  *R         `json:"result"`
	Error   *errorBody `json:"error"`
}

// readStream copies a streamed answer's output to stdout and stderr (nil discards) until its result or its error;
// what names the stream and whose output it is in errors ("the exec stream", "the command's"). A stream cut by
// ctx is ctx's cause.
func readStream[R any](ctx context.Context, resp *http.Response, stdout, stderr io.Writer, what, whose string) (*R, error) {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var m streamFrame[R]
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			return nil, fmt.Errorf("client: %s ended before its result: %w", what, err)
		}
		switch {
		case m.Result != nil:
			return m.Result, nil
		case m.Error != nil:
			return nil, &APIError{Status: resp.StatusCode, RequestID: resp.Header.Get("X-Request-Id"), Err: faultOf(*m.Error)}
		}
		data := m.DataB64
		if m.Data != nil {
			data = []byte(*m.Data)
		}
		w := stdout
		if m.Stream == "stderr" {
			w = stderr
		}
		if _, err := w.Write(data); err != nil {
			return nil, fmt.Errorf("client: write %s %s: %w", whose, m.Stream, err)
		}
	}
}

// ExecStream runs one command and writes its output to stdout and stderr (nil discards) as it is produced;
// the result it returns has empty Stdout and Stderr. A write error stops reading and cancels the command.
func (c *Client) ExecStream(ctx context.Context, user string, req ExecRequest, stdout, stderr io.Writer) (*ExecResult, error) {
	body, err := req.body()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // leaving early (a write error) closes the connection: the server cancels the command
	resp, err := c.do(ctx, "POST", "/v1/sandboxes/"+escape(user)+"/exec", nil, bytes.NewReader(body),
		jsonHeader(req, "application/x-ndjson"))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readStream[ExecResult](ctx, resp, stdout, stderr, "the exec stream", "the command's")
}

// Upload streams r into the file at path in user's workspace (parents created; the file appears whole or not
// at all) and returns the bytes written. mode is its permission bits; zero means 0644.
func (c *Client) Upload(ctx context.Context, user, path string, r io.Reader, mode fs.FileMode) (int64, error) {
	q := url.Values{}
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", mode.Perm()))
	}
	var out struct {
		Bytes int64 `json:"bytes"`
	}
	err := c.call(ctx, "PUT", filesPath(user, path), q, r, http.Header{"Content-Type": {"application/octet-stream"}}, &out)
	return out.Bytes, err
}

// UploadTar extracts the tar stream r under the directory dir of user's workspace (created when missing).
func (c *Client) UploadTar(ctx context.Context, user, dir string, r io.Reader) (TarSummary, error) {
	var sum TarSummary
	err := c.call(ctx, "PUT", filesPath(user, dir), nil, r, http.Header{"Content-Type": {"application/x-tar"}}, &sum)
	return sum, err
}

func filesPath(user, path string) string {
	return "/v1/sandboxes/" + escape(user) + "/files/" + escape(path)
}

// open GETs path and checks that the answer is of media type want; a file where a directory was expected (or
// the reverse) is a FILE_TYPE error.
func (c *Client) open(ctx context.Context, user, path, want string) (*http.Response, error) {
	resp, err := c.do(ctx, "GET", filesPath(user, path), nil, nil, nil)
	if err != nil {
		return nil, err
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != want {
		resp.Body.Close()
		what := map[string]string{"application/x-tar": "a directory", "application/octet-stream": "a file"}[want]
		return nil, &APIError{Status: resp.StatusCode, RequestID: resp.Header.Get("X-Request-Id"), Err: fault.New(fault.FileType,
			"use Download for a file and DownloadTar for a directory", "%q is not %s", path, what)}
	}
	return resp, nil
}

// Download writes the file at path in user's workspace to w and returns its size. A download cut short is an
// error (io.ErrUnexpectedEOF), never a shorter file.
func (c *Client) Download(ctx context.Context, user, path string, w io.Writer) (int64, error) {
	resp, err := c.open(ctx, user, path, "application/octet-stream")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// DownloadTar writes the tree under the directory dir of user's workspace to w as a tar stream (symlinks as
// links). A stream the server cut off is an error.
func (c *Client) DownloadTar(ctx context.Context, user, dir string, w io.Writer) error {
	resp, err := c.open(ctx, user, dir, "application/x-tar")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}

// List lists the directory at path in user's workspace ("" for /workspace itself), sorted by name.
func (c *Client) List(ctx context.Context, user, path string) ([]Entry, error) {
	var out struct {
		Entries []Entry `json:"entries"`
	}
	err := c.call(ctx, "GET", filesPath(user, path), url.Values{"list": {"1"}}, nil, nil, &out)
	return out.Entries, err
}

// Sandboxes lists the tenant's sandboxes, sorted by user.
func (c *Client) Sandboxes(ctx context.Context) ([]Sandbox, error) {
	var out wire.SandboxList
	err := c.call(ctx, "GET", "/v1/sandboxes", nil, nil, nil, &out)
	return out.Sandboxes, err
}

// Sandbox describes user's sandbox; none is SANDBOX_NOT_FOUND.
func (c *Client) Sandbox(ctx context.Context, user string) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, "GET", "/v1/sandboxes/"+escape(user), nil, nil, nil, &sb)
	return sb, err
}

// Stop stops user's sandbox; the next command starts it again. It needs the admin scope.
func (c *Client) Stop(ctx context.Context, user string) error {
	return c.call(ctx, "POST", "/v1/sandboxes/"+escape(user)+"/stop", nil, nil, nil, nil)
}

// Remove deletes user's sandbox and its workspace. It needs the admin scope.
func (c *Client) Remove(ctx context.Context, user string) error {
	return c.call(ctx, "DELETE", "/v1/sandboxes/"+escape(user), nil, nil, nil, nil)
}

// AdmittedRun is a run as admission recorded it: commands attach to it with ExecRequest.RunID.
type AdmittedRun = wire.RunAdmitted

// StartRun admits a run for user (the same admission as an exec's own run), with a template ("" the tenant's
// default) and a trust ("untrusted" lowers the token's). It needs the exec scope.
func (c *Client) StartRun(ctx context.Context, user, template, trust string) (AdmittedRun, error) {
	b, err := json.Marshal(wire.RunStart{Template: template, Trust: trust})
	if err != nil {
		return AdmittedRun{}, err
	}
	var r AdmittedRun
	err = c.call(ctx, "POST", "/v1/sandboxes/"+escape(user)+"/runs", nil, bytes.NewReader(b), jsonBody(), &r)
	return r, err
}

// FinishRun closes a running run as succeeded, or failed (CALLER_FAILED).
func (c *Client) FinishRun(ctx context.Context, id string, failed bool) (Run, error) {
	b, _ := json.Marshal(wire.RunFinish{Failed: failed})
	var r Run
	err := c.call(ctx, "POST", "/v1/runs/"+escape(id)+"/finish", nil, bytes.NewReader(b), jsonBody(), &r)
	return r, err
}

// Templates lists the operator templates the token's tenant may use.
func (c *Client) Templates(ctx context.Context) ([]string, error) {
	var out wire.TemplateList
	err := c.call(ctx, "GET", "/v1/templates", nil, nil, nil, &out)
	return out.Templates, err
}

// RunFilter selects runs; zero fields match everything.
type RunFilter struct {
	User   string
	Status string    // running, succeeded, failed or failed_resumable
	Limit  int       // at most this many (the server's default is 100, its maximum 1000)
	Before time.Time // only runs created before: the CreatedAt of the last run of the previous page
}

// Runs lists the tenant's runs, newest first.
func (c *Client) Runs(ctx context.Context, f RunFilter) ([]Run, error) {
	q := url.Values{}
	if f.User != "" {
		q.Set("user", f.User)
	}
	if f.Status != "" {
		q.Set("status", f.Status)
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	if !f.Before.IsZero() {
		q.Set("before", f.Before.UTC().Format(time.RFC3339Nano))
	}
	var out struct {
		Runs []Run `json:"runs"`
	}
	err := c.call(ctx, "GET", "/v1/runs", q, nil, nil, &out)
	return out.Runs, err
}

// Run returns one run of the tenant; another tenant's, like a missing one, is RUN_NOT_FOUND.
func (c *Client) Run(ctx context.Context, id string) (Run, error) {
	var r Run
	err := c.call(ctx, "GET", "/v1/runs/"+escape(id), nil, nil, nil, &r)
	return r, err
}

// Events lists run id's events with a sequence number above after, in order.
func (c *Client) Events(ctx context.Context, id string, after int64) ([]Event, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	var out struct {
		Events []Event `json:"events"`
	}
	err := c.call(ctx, "GET", "/v1/runs/"+escape(id)+"/events", q, nil, nil, &out)
	return out.Events, err
}

// FollowEvents calls fn with each event of run id after sequence number after, as they are recorded, until
// the run is finished and all its events were delivered (nil), fn returns an error (that error), or ctx ends.
// A stream the server ended early (it was draining) is an error wrapping io.ErrUnexpectedEOF: call again with
// the Seq of the last event fn saw.
func (c *Client) FollowEvents(ctx context.Context, id string, after int64, fn func(Event) error) error {
	return follow(ctx, c, "/v1/runs/"+escape(id)+"/events", after, fn)
}

// follow reads the SSE stream of path?follow=1&after=after, calling fn with each message decoded as a T, until
// the stream's end message (nil), an error message or fn's error (that error), or ctx ends.
func follow[T any](ctx context.Context, c *Client, path string, after int64, fn func(T) error) error {
	q := url.Values{"follow": {"1"}}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := c.do(ctx, "GET", path, q, nil, http.Header{"Accept": {"text/event-stream"}})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return readSSE(resp.Body, func(event string, data []byte) (bool, error) {
		switch event {
		case "end":
			return true, nil
		case "error":
			var m struct {
				Error errorBody `json:"error"`
			}
			if err := json.Unmarshal(data, &m); err != nil {
				return true, fmt.Errorf("client: decode an event stream error: %w", err)
			}
			return true, &APIError{Status: resp.StatusCode, RequestID: resp.Header.Get("X-Request-Id"), Err: faultOf(m.Error)}
		}
		var e T
		if err := json.Unmarshal(data, &e); err != nil {
			return true, fmt.Errorf("client: decode a %s message: %w", event, err)
		}
		return false, fn(e)
	})
}

func jsonBody() http.Header { return http.Header{"Content-Type": {"application/json"}} }
