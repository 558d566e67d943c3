package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/service"
)

// Limits on one tool call's input. They keep a request well inside what execve and the transports accept, so
// an oversized input fails here with a clear code instead of deep in the engine.
const (
	MaxCommandBytes = 128 << 10 // command: Linux's MAX_ARG_STRLEN, the most one argument (sh -c's) may hold
	MaxArgs         = 4096      // argv entries
	MaxArgBytes     = 1 << 20   // argv (or command) plus env, in bytes: half of the usual ARG_MAX
	MaxEnvVars      = 256       // env entries
	MaxStdinBytes   = 1 << 20   // stdin, in bytes
	MaxPathBytes    = 4096      // path and workdir, in bytes: PATH_MAX
	MaxTimeout      = 3600      // timeout_seconds
	DefaultTimeout  = 120       // timeout_seconds when not given
)

// ExecInput is the exec tool's input.
type ExecInput struct {
	Command        string            `json:"command,omitempty" jsonschema:"a shell command line, run with sh -c (pipes, redirections and && work); give this or argv, not both; at most 128 KiB"`
	Argv           []string          `json:"argv,omitempty" jsonschema:"a program and its arguments, run directly without a shell; give this or command, not both; at most 4096 entries"`
	Workdir        string            `json:"workdir,omitempty" jsonschema:"the directory to run in: relative to /workspace or absolute under it, created when missing; default /workspace"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"seconds before the command and every process it started are killed (timed_out is then true and exit_code 124); 1 to 3600, default 120"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables added for this command only, name to value; at most 256"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"text given to the command on its standard input (default: none, it reads end of file); at most 1 MiB"`
	Template       string            `json:"template,omitempty" jsonschema:"the sandbox template to run in, one the operator offers this session (default: the session's own); another template recycles the sandbox"`
}

// ExecOutput is the exec tool's result. A non-zero exit code is a normal result, not a tool error.
type ExecOutput struct {
	ExitCode        int    `json:"exit_code" jsonschema:"the command's exit status: 0 for success, 128+N when killed by signal N, 124 when it timed out"`
	TimedOut        bool   `json:"timed_out" jsonschema:"true when the timeout passed and the command's processes were killed"`
	Stdout          string `json:"stdout" jsonschema:"what the command wrote to standard output (invalid UTF-8 is replaced)"`
	Stderr          string `json:"stderr" jsonschema:"what the command wrote to standard error (invalid UTF-8 is replaced)"`
	StdoutTruncated bool   `json:"stdout_truncated" jsonschema:"true when stdout passed the output limit, or what this result holds, and only its beginning is kept"`
	StderrTruncated bool   `json:"stderr_truncated" jsonschema:"true when stderr passed the output limit, or what this result holds, and only its beginning is kept"`
	DurationMS      int64  `json:"duration_ms" jsonschema:"how long the command ran, in milliseconds"`
	StdoutFile      string `json:"stdout_file,omitempty" jsonschema:"when stdout was longer than this result holds: the file in the sandbox with all of it (read it with read_file, or grep/tail it with exec)"`
	StderrFile      string `json:"stderr_file,omitempty" jsonschema:"when stderr was longer than this result holds: the file in the sandbox with all of it"`
}

// ReadFileInput is the read_file tool's input.
type ReadFileInput struct {
	Path string `json:"path" jsonschema:"the file to read: relative to /workspace or absolute under it"`
}

// ReadFileOutput is the read_file tool's result.
type ReadFileOutput struct {
	Path     string `json:"path" jsonschema:"the path that was read, as given"`
	Size     int64  `json:"size" jsonschema:"the file's size in bytes"`
	Encoding string `json:"encoding" jsonschema:"how content is encoded: utf-8 for text, base64 for binary data (invalid UTF-8 or NUL bytes)"`
	Content  string `json:"content" jsonschema:"the file's content, in the encoding named by encoding"`
}

// WriteFileInput is the write_file tool's input.
type WriteFileInput struct {
	Path     string `json:"path" jsonschema:"the file to write: relative to /workspace or absolute under it; missing parent directories are created, an existing file is replaced"`
	Content  string `json:"content" jsonschema:"the file's new content, in the encoding named by encoding; at most 1 MiB once decoded unless the server says otherwise"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (default) when content is the text itself, base64 when it is binary data in standard base64"`
	Mode     string `json:"mode,omitempty" jsonschema:"the file's permission bits in octal, e.g. 0644 (default) or 0755 for a script"`
}

// WriteFileOutput is the write_file tool's result.
type WriteFileOutput struct {
	Path  string `json:"path" jsonschema:"the path that was written, as given"`
	Bytes int64  `json:"bytes" jsonschema:"how many bytes the file now holds"`
}

// ListFilesInput is the list_files tool's input.
type ListFilesInput struct {
	Path string `json:"path,omitempty" jsonschema:"the directory to list: relative to /workspace or absolute under it; default the workspace itself"`
}

// FileEntry is one entry of a listing.
type FileEntry struct {
	Name   string    `json:"name" jsonschema:"the entry's name within the directory"`
	Type   string    `json:"type" jsonschema:"file, dir, symlink or other"`
	Size   int64     `json:"size" jsonschema:"size in bytes"`
	Mode   string    `json:"mode" jsonschema:"permission bits in octal, e.g. 0644"`
	MTime  time.Time `json:"mtime" jsonschema:"last modification time (RFC 3339)"`
	Target string    `json:"target,omitempty" jsonschema:"where a symlink points, as written in the link (never followed)"`
}

// ListFilesOutput is the list_files tool's result.
type ListFilesOutput struct {
	Path      string      `json:"path" jsonschema:"the directory that was listed, as given"`
	Entries   []FileEntry `json:"entries" jsonschema:"the directory's entries, sorted by name"`
	Truncated bool        `json:"truncated" jsonschema:"true when the directory holds more entries than were returned"`
}

// StatusInput is the sandbox_status tool's input: nothing.
type StatusInput struct{}

// StatusOutput is the sandbox_status tool's result.
type StatusOutput struct {
	Exists    bool      `json:"exists" jsonschema:"whether the sandbox exists yet; the first exec creates it"`
	State     string    `json:"state" jsonschema:"the sandbox's state, e.g. running or exited; none when it does not exist yet"`
	Tenant    string    `json:"tenant" jsonschema:"the tenant the sandbox belongs to"`
	User      string    `json:"user" jsonschema:"the user the sandbox belongs to"`
	Name      string    `json:"name,omitempty" jsonschema:"the sandbox container's name"`
	Image     string    `json:"image,omitempty" jsonschema:"the image the sandbox runs"`
	CreatedAt time.Time `json:"created_at,omitzero" jsonschema:"when the sandbox was created (RFC 3339)"`
	LastUsed  time.Time `json:"last_used,omitzero" jsonschema:"when a command last ran in it (RFC 3339)"`
	IdleFor   string    `json:"idle_for,omitempty" jsonschema:"how long it has been idle, e.g. 3m0s"`
	Message   string    `json:"message,omitempty" jsonschema:"a sentence about the state, e.g. that no sandbox exists yet"`
}

// tools carries what every tool call of one server needs.
type tools struct {
	b         service.Backend
	key       sandkeep.Key
	opts      Options
	authorize func(tool string) error // nil: every tool is allowed
	requestID string                  // recorded on exec's events; empty over stdio
	// requestCtx, over HTTP, is the context of the one request this server answers. Tool calls end with it:
	// the SDK ties them to the request only for the newest protocol, and a command whose client went away
	// must not run on to its timeout. Nil over stdio, where the SDK's cancellation suffices.
	requestCtx context.Context
}

// toolDefs are the tools with their input schemas, built once: the schemas are inferred from the input types
// and then given the bounds and defaults a tag cannot express, so a client sees the limits before it calls.
var toolDefs = struct {
	exec, read, write, list, status *mcp.Tool
}{
	exec: &mcp.Tool{
		Name: ToolExec, Title: "Run a command",
		Description: "Run a command in the sandbox and return its exit code, stdout and stderr. Give command " +
			"(a shell line) or argv. The sandbox and its /workspace persist between calls.",
		Annotations: &mcp.ToolAnnotations{Title: "Run a command", OpenWorldHint: new(true)},
		InputSchema: inputSchema[ExecInput](func(s *jsonschema.Schema) {
			ts := s.Properties["timeout_seconds"]
			ts.Minimum, ts.Maximum, ts.Default = new(1.0), new(float64(MaxTimeout)), []byte(strconv.Itoa(DefaultTimeout))
			s.Properties["argv"].MaxItems = new(MaxArgs)
			s.Properties["env"].MaxProperties = new(MaxEnvVars)
		}),
	},
	read: &mcp.Tool{
		Name: ToolReadFile, Title: "Read a file",
		Description: "Read a file from the sandbox's workspace. Text comes back as is (encoding utf-8), " +
			"binary data as base64.",
		Annotations: &mcp.ToolAnnotations{Title: "Read a file", ReadOnlyHint: true, OpenWorldHint: new(false)},
		InputSchema: inputSchema[ReadFileInput](nil),
	},
	write: &mcp.Tool{
		Name: ToolWriteFile, Title: "Write a file",
		Description: "Write a file in the sandbox's workspace, creating missing directories and replacing " +
			"an existing file whole.",
		Annotations: &mcp.ToolAnnotations{Title: "Write a file", IdempotentHint: true, OpenWorldHint: new(false)},
		InputSchema: inputSchema[WriteFileInput](func(s *jsonschema.Schema) {
			enc := s.Properties["encoding"]
			enc.Enum, enc.Default = []any{encodingUTF8, encodingBase64}, []byte(`"`+encodingUTF8+`"`)
			mode := s.Properties["mode"]
			mode.Pattern, mode.Default = `^(0o|0)?[0-7]{1,3}$`, []byte(`"0644"`)
		}),
	},
	list: &mcp.Tool{
		Name: ToolListFiles, Title: "List a directory",
		Description: "List a directory of the sandbox's workspace: name, type, size, mode and modification " +
			"time of each entry.",
		Annotations: &mcp.ToolAnnotations{Title: "List a directory", ReadOnlyHint: true, OpenWorldHint: new(false)},
		InputSchema: inputSchema[ListFilesInput](nil),
	},
	status: &mcp.Tool{
		Name: ToolSandboxStatus, Title: "Sandbox status",
		Description: "Describe the sandbox: whether it exists yet, its state, image, creation and last use.",
		Annotations: &mcp.ToolAnnotations{Title: "Sandbox status", ReadOnlyHint: true, OpenWorldHint: new(false)},
		InputSchema: inputSchema[StatusInput](nil),
	},
}

// inputSchema infers T's schema and lets adjust add what tags cannot say. A failure is a bug in this file,
// caught by the first test that builds a server.
func inputSchema[T any](adjust func(*jsonschema.Schema)) *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: input schema: %v", err))
	}
	if adjust != nil {
		adjust(s)
	}
	return s
}

func (t *tools) register(s *mcp.Server) {
	mcp.AddTool(s, toolDefs.exec, handle(t, ToolExec, t.exec))
	mcp.AddTool(s, toolDefs.read, handle(t, ToolReadFile, t.readFile))
	mcp.AddTool(s, toolDefs.write, handle(t, ToolWriteFile, t.writeFile))
	mcp.AddTool(s, toolDefs.list, handle(t, ToolListFiles, t.listFiles))
	mcp.AddTool(s, toolDefs.status, handle(t, ToolSandboxStatus, t.status))
	t.registerFork(s)
	t.registerSnapshots(s)
	t.registerProcesses(s)
}

// handle adapts a tool to the SDK: it admits the call, runs it, and turns every failure into a *fault.Error,
// which the toolErrors middleware then renders. An error that is not a *fault.Error reaching the middleware
// therefore comes from the SDK's own argument validation.
func handle[In, Out any](t *tools, name string, h func(context.Context, In) (Out, error)) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, _ *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		var zero Out
		if t.requestCtx != nil {
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(ctx)
			defer cancel()
			stop := context.AfterFunc(t.requestCtx, cancel)
			defer stop()
		}
		if err := t.admit(name); err != nil {
			return nil, zero, err
		}
		out, err := h(ctx, in)
		if err != nil {
			return nil, zero, t.failure(ctx, name, err)
		}
		return nil, out, nil
	}
}

// admit refuses a call for a server without a key, or that Options.Authorize refuses.
func (t *tools) admit(tool string) error {
	if t.key.IsZero() {
		return fault.New(fault.InvalidIdentity, "start the server with a tenant and a user",
			"this MCP server is not bound to a sandbox")
	}
	if t.authorize == nil {
		return nil
	}
	if err := t.authorize(tool); err != nil {
		if fault.CodeOf(err) != "" {
			return err
		}
		return fault.Wrap(err, fault.Forbidden, "use a token whose scopes include "+Scope(tool),
			"this token may not use the %s tool", tool)
	}
	return nil
}

// failure makes err a *fault.Error. Causes without a code are logged, not shown: they may name host paths.
func (t *tools) failure(ctx context.Context, tool string, err error) *fault.Error {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return fe
	}
	if ctx.Err() != nil {
		return fault.Wrap(err, fault.Internal, "call the tool again", "the %s call was cancelled before it finished", tool)
	}
	t.opts.Logger.ErrorContext(ctx, "mcp tool failed", "tool", tool, "tenant", t.key.Tenant, "user", t.key.User,
		"err", err)
	return fault.Wrap(err, fault.Internal, "try again; if it keeps failing, report it with the server's log",
		"the %s tool failed inside sandkeep", tool)
}

func (t *tools) exec(ctx context.Context, in ExecInput) (ExecOutput, error) {
	req, err := execRequest(in, t.opts.OutputLimit)
	if err != nil {
		return ExecOutput{}, err
	}
	ar := service.AdmitRequest{Template: in.Template, RequestID: t.requestID}
	// The output streams into captures, never whole into the result: each keeps ResultLimit bytes and spills
	// the whole stream into the workspace past them.
	open := func() (*files.FS, error) { return t.b.Workspace(ctx, t.key, true) }
	name := outputName()
	stdout := newCapture(ctx, open, name+".stdout", t.opts.ResultLimit)
	stderr := newCapture(ctx, open, name+".stderr", t.opts.ResultLimit)
	req.Stdout, req.Stderr = stdout, stderr
	res, err := t.b.Exec(ctx, t.key, ar, req)
	if err == nil && res == nil {
		err = errors.New("backend returned neither a result nor an error")
	}
	if res != nil { // a backend that collected the output anyway goes through the same bound
		_, _ = io.WriteString(stdout, res.Stdout)
		_, _ = io.WriteString(stderr, res.Stderr)
	}
	out := ExecOutput{}
	if res != nil {
		out = ExecOutput{ExitCode: res.ExitCode, TimedOut: res.TimedOut, StdoutTruncated: res.StdoutTruncated,
			StderrTruncated: res.StderrTruncated, DurationMS: res.DurationMS}
	}
	out.Stdout, out.StdoutFile = stdout.finish(out.StdoutTruncated)
	out.Stderr, out.StderrFile = stderr.finish(out.StderrTruncated)
	if err != nil {
		return ExecOutput{}, err
	}
	out.StdoutTruncated = out.StdoutTruncated || out.StdoutFile != "" || stdout.total > int64(stdout.limit)
	out.StderrTruncated = out.StderrTruncated || out.StderrFile != "" || stderr.total > int64(stderr.limit)
	return out, nil
}

// execRequest checks in against the tool's own limits and makes the library's request. The engine checks the
// command itself (argv, workdir, env, bounds) with the one validator every entry point shares.
func execRequest(in ExecInput, outputLimit int64) (sandkeep.ExecRequest, error) {
	invalid := func(hint, format string, args ...any) (sandkeep.ExecRequest, error) {
		return sandkeep.ExecRequest{}, fault.New(fault.InvalidArgument, hint, format, args...)
	}
	var argv []string
	total := 0
	switch {
	case in.Command != "" && len(in.Argv) > 0:
		return invalid("give command for a shell line, or argv for a program and its arguments", "both command and argv were given")
	case in.Command != "":
		if len(in.Command) > MaxCommandBytes {
			return invalid("put a long script in a file with write_file and run that",
				"command is %d bytes long, over the limit of %d", len(in.Command), MaxCommandBytes)
		}
		if strings.IndexByte(in.Command, 0) >= 0 {
			return invalid("remove the NUL byte; a process cannot receive it", "command contains a NUL byte")
		}
		argv, total = []string{"sh", "-c", in.Command}, len(in.Command)
	case len(in.Argv) > 0:
		if len(in.Argv) > MaxArgs {
			return invalid("pass long lists in a file with write_file", "argv has %d entries, over the limit of %d", len(in.Argv), MaxArgs)
		}
		if in.Argv[0] == "" {
			return invalid("put the program to run first in argv", "argv[0] is empty")
		}
		for i, a := range in.Argv {
			if len(a) > MaxCommandBytes {
				return invalid("pass large data as a file with write_file", "argv[%d] is %d bytes long, over the limit of %d", i, len(a), MaxCommandBytes)
			}
			if strings.IndexByte(a, 0) >= 0 {
				return invalid("remove the NUL byte; a process cannot receive it", "argv[%d] contains a NUL byte", i)
			}
			total += len(a)
		}
		argv = slices.Clone(in.Argv)
	default:
		return invalid("give command (a shell line) or argv (a program and its arguments)", "no command to run")
	}

	if len(in.Workdir) > MaxPathBytes {
		return invalid("use a shorter path", "workdir is %d bytes long, over the limit of %d", len(in.Workdir), MaxPathBytes)
	}
	timeout := in.TimeoutSeconds
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	if timeout < 1 || timeout > MaxTimeout {
		return sandkeep.ExecRequest{}, fault.New(fault.InvalidTimeout, "give timeout_seconds from 1 to 3600",
			"timeout_seconds is %d, outside 1..%d", in.TimeoutSeconds, MaxTimeout)
	}
	if len(in.Env) > MaxEnvVars {
		return sandkeep.ExecRequest{}, fault.New(fault.InvalidEnv, "pass fewer variables, or put them in a file and source it",
			"env has %d variables, over the limit of %d", len(in.Env), MaxEnvVars)
	}
	var env []string
	for _, name := range slices.Sorted(maps.Keys(in.Env)) {
		value := in.Env[name]
		if name == "" || strings.ContainsAny(name, "=\x00") { // a name "K=V" cannot carry; the engine checks the rest
			return sandkeep.ExecRequest{}, fault.New(fault.InvalidEnv, "use names of letters, digits and _",
				"environment variable name %q is refused", name)
		}
		env = append(env, name+"="+value)
		total += len(name) + 1 + len(value)
	}
	if total > MaxArgBytes {
		return invalid("put large data in a file with write_file and read it from there",
			"the command and its environment are %d bytes, over the limit of %d", total, MaxArgBytes)
	}
	if len(in.Stdin) > MaxStdinBytes {
		return invalid("write large input to a file with write_file and redirect it (< file)",
			"stdin is %d bytes long, over the limit of %d", len(in.Stdin), MaxStdinBytes)
	}
	req := sandkeep.ExecRequest{Argv: argv, Workdir: in.Workdir, Env: env,
		Timeout: time.Duration(timeout) * time.Second, OutputLimit: outputLimit}
	if in.Stdin != "" {
		req.Stdin = strings.NewReader(in.Stdin)
	}
	// The bounds above are the tool's own, tighter ones; the command itself is checked once, by the engine.
	return req, nil
}

// checkPath bounds a path before it reaches the workspace, which confines it.
func checkPath(what, p string) error {
	if len(p) > MaxPathBytes {
		return fault.New(fault.InvalidPath, "use a shorter path", "%s is %d bytes long, over the limit of %d", what, len(p), MaxPathBytes)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return fault.New(fault.InvalidPath, "remove the NUL byte from the path", "%s contains a NUL byte", what)
	}
	return nil
}

// Encodings of read_file's and write_file's content.
const (
	encodingUTF8   = "utf-8"
	encodingBase64 = "base64"
)

func (t *tools) readFile(ctx context.Context, in ReadFileInput) (ReadFileOutput, error) {
	if err := checkPath("path", in.Path); err != nil {
		return ReadFileOutput{}, err
	}
	ws, err := t.b.Workspace(ctx, t.key, false)
	if err != nil {
		return ReadFileOutput{}, err
	}
	defer ws.Close()
	rc, ent, err := ws.OpenFile(in.Path)
	if err != nil {
		return ReadFileOutput{}, err
	}
	defer rc.Close()
	limit := t.opts.MaxReadBytes
	tooLarge := func(size int64) error {
		return fault.New(fault.FileTooLarge,
			"read part of it with exec (head -c, sed -n, grep), or download it through the HTTP API",
			"%s is %d bytes, over the %d bytes read_file returns", in.Path, size, limit)
	}
	if ent.Size > limit {
		return ReadFileOutput{}, tooLarge(ent.Size)
	}
	// The sandbox may grow the file while it is read: read one byte past the limit to notice.
	data, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return ReadFileOutput{}, err
	}
	if int64(len(data)) > limit {
		return ReadFileOutput{}, tooLarge(int64(len(data)))
	}
	out := ReadFileOutput{Path: in.Path, Size: int64(len(data)), Encoding: encodingUTF8, Content: string(data)}
	if !utf8.Valid(data) || bytes.IndexByte(data, 0) >= 0 {
		out.Encoding, out.Content = encodingBase64, base64.StdEncoding.EncodeToString(data)
	}
	return out, nil
}

func (t *tools) writeFile(ctx context.Context, in WriteFileInput) (WriteFileOutput, error) {
	if err := checkPath("path", in.Path); err != nil {
		return WriteFileOutput{}, err
	}
	data, err := decodeContent(in.Content, in.Encoding, t.opts.MaxWriteBytes)
	if err != nil {
		return WriteFileOutput{}, err
	}
	mode, err := parseMode(in.Mode)
	if err != nil {
		return WriteFileOutput{}, err
	}
	ws, err := t.b.Workspace(ctx, t.key, true)
	if err != nil {
		return WriteFileOutput{}, err
	}
	defer ws.Close()
	n, err := ws.Write(ctx, in.Path, bytes.NewReader(data), mode)
	if err != nil {
		return WriteFileOutput{}, err
	}
	return WriteFileOutput{Path: in.Path, Bytes: n}, nil
}

// decodeContent decodes write_file's content, refusing more than limit bytes before allocating them.
func decodeContent(content, encoding string, limit int64) ([]byte, error) {
	tooLarge := func(n int64) error {
		return fault.New(fault.FileTooLarge,
			"upload it through the HTTP API (PUT /v1/sandboxes/{user}/files/{path}), or produce it inside the sandbox with exec",
			"the content is %d bytes, over the %d bytes write_file accepts", n, limit)
	}
	switch encoding {
	case "", encodingUTF8:
		if int64(len(content)) > limit {
			return nil, tooLarge(int64(len(content)))
		}
		return []byte(content), nil
	case encodingBase64:
		// DecodedLen over-estimates by at most 2 bytes of padding (and more for line breaks), so this refuses
		// only what cannot fit.
		if n := int64(base64.StdEncoding.DecodedLen(len(content))); n > limit+2 {
			return nil, tooLarge(n)
		}
		data, err := base64.StdEncoding.DecodeString(content)
		if err != nil {
			return nil, fault.Wrap(err, fault.InvalidArgument, "encode the content in standard base64 (RFC 4648, with padding)",
				"content is not valid base64: %v", err)
		}
		if int64(len(data)) > limit {
			return nil, tooLarge(int64(len(data)))
		}
		return data, nil
	}
	return nil, fault.New(fault.InvalidArgument, `use "utf-8" for text or "base64" for binary data`,
		"unknown encoding %q", encoding)
}

// parseMode parses write_file's mode: permission bits in octal. Setuid, setgid and sticky are refused: a file
// the host writes for the sandbox has no business carrying them.
func parseMode(s string) (fs.FileMode, error) {
	if s == "" {
		return 0o644, nil
	}
	digits := strings.TrimPrefix(s, "0o")
	v, err := strconv.ParseUint(digits, 8, 32)
	// 0 is refused rather than passed on: the workspace reads a zero mode as "the default".
	if err != nil || digits == "" || len(digits) > 4 || v == 0 || v > 0o777 {
		return 0, fault.New(fault.InvalidArgument, "give permission bits in octal, 0001 to 0777, e.g. 0644 or 0755",
			"mode %q is not a file permission", s)
	}
	return fs.FileMode(v), nil
}

func (t *tools) listFiles(ctx context.Context, in ListFilesInput) (ListFilesOutput, error) {
	if err := checkPath("path", in.Path); err != nil {
		return ListFilesOutput{}, err
	}
	ws, err := t.b.Workspace(ctx, t.key, false)
	if err != nil {
		return ListFilesOutput{}, err
	}
	defer ws.Close()
	list, err := ws.List(in.Path)
	if err != nil {
		return ListFilesOutput{}, err
	}
	out := ListFilesOutput{Path: in.Path, Entries: make([]FileEntry, 0, min(len(list), t.opts.MaxListEntries))}
	if len(list) > t.opts.MaxListEntries {
		list, out.Truncated = list[:t.opts.MaxListEntries], true
	}
	for _, e := range list {
		out.Entries = append(out.Entries, FileEntry{Name: e.Name, Type: e.Type, Size: e.Size, Mode: e.Mode,
			MTime: e.MTime, Target: e.Target})
	}
	return out, nil
}

func (t *tools) status(ctx context.Context, _ StatusInput) (StatusOutput, error) {
	sb, err := t.b.Sandbox(ctx, t.key)
	if fault.Is(err, fault.NotFound) {
		return StatusOutput{State: "none", Tenant: t.key.Tenant, User: t.key.User,
			Message: "no sandbox exists yet; the first exec creates it"}, nil
	}
	if err != nil {
		return StatusOutput{}, err
	}
	return StatusOutput{Exists: true, State: sb.State, Tenant: t.key.Tenant, User: t.key.User, Name: sb.Name,
		Image: sb.Image, CreatedAt: sb.CreatedAt, LastUsed: sb.LastUsed, IdleFor: sb.IdleFor}, nil
}
