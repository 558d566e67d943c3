// Package mcpserver serves one sandbox's tools over the Model Context Protocol: exec, read_file, write_file,
// list_files and sandbox_status, bound to one (tenant, user) key, on top of service.Backend. It speaks stdio
// (ServeStdio, for `sandkeep mcp`) and streamable HTTP (Handler, for `/mcp` in `sandkeep serve`).
//
// A failure is always a tool result with IsError set, text "CODE: message (hint: ...)" and structured content
// {code, message, hint}: never a JSON-RPC error, so the model reads it and can correct itself. A command that
// exits non-zero or times out is a normal result, not a failure.
package mcpserver

import (
	"context"
	"log/slog"
	"net/http"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
)

// Defaults for the zero fields of Options.
const (
	DefaultMaxReadBytes   = 1 << 20 // read_file returns at most this much
	DefaultMaxWriteBytes  = 1 << 20 // write_file accepts at most this much, decoded
	DefaultMaxListEntries = 1000    // list_files returns at most this many entries
)

// Options tune a server. The zero value is usable.
type Options struct {
	// MaxReadBytes bounds the file read_file returns (default 1 MiB); a larger file is FILE_TOO_LARGE.
	MaxReadBytes int64
	// MaxWriteBytes bounds the decoded content write_file accepts (default 1 MiB); more is FILE_TOO_LARGE.
	MaxWriteBytes int64
	// MaxListEntries bounds the entries list_files returns (default 1000); past it the listing says truncated.
	MaxListEntries int
	// OutputLimit bounds each of an exec's stdout and stderr, in bytes; zero is the library's default (1 MiB).
	OutputLimit int64
	// ResultLimit bounds each of stdout and stderr in an exec result (default 64 KiB); a longer stream is cut
	// there with a marker, and all of it (up to OutputLimit) is kept in a file under OutputDir in the workspace.
	ResultLimit int
	// Version is reported to clients as the server's version; empty is "dev".
	Version string
	// Logger receives the SDK's log and the causes of INTERNAL tool errors (which clients see only as a code
	// and a generic sentence); nil discards them.
	Logger *slog.Logger

	// Authorize, used by Handler only, is asked before every tool call of an HTTP request whether the caller
	// may use that tool (see Scope); an error refuses the call as a tool error carrying the error's code
	// (FORBIDDEN when it has none). Nil allows every tool.
	Authorize func(r *http.Request, tool string) error
	// RequestID, used by Handler only, names the HTTP request; exec records it on the command's events.
	RequestID func(r *http.Request) string
}

func (o Options) withDefaults() Options {
	if o.MaxReadBytes <= 0 {
		o.MaxReadBytes = DefaultMaxReadBytes
	}
	if o.ResultLimit <= 0 {
		o.ResultLimit = DefaultResultLimit
	}
	if o.MaxWriteBytes <= 0 {
		o.MaxWriteBytes = DefaultMaxWriteBytes
	}
	if o.MaxListEntries <= 0 {
		o.MaxListEntries = DefaultMaxListEntries
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Tool names.
const (
	ToolExec          = "exec"
	ToolReadFile      = "read_file"
	ToolWriteFile     = "write_file"
	ToolListFiles     = "list_files"
	ToolSandboxStatus = "sandbox_status"
)

// Scope is the token scope (store.Scope*) a tool needs: exec for exec, files for the file tools, read for
// sandbox_status. An unknown tool needs admin, so a mapping that falls behind the tool list fails closed.
func Scope(tool string) string {
	switch tool {
	case ToolExec, ToolFork, ToolCreateSnapshot, ToolRestoreSnapshot, ToolDeleteSnapshot, // they make sandboxes or archives
		ToolStartProcess, ToolProcessOut, ToolProcessInput, ToolKillProcess: // a process's output is a command's
		return store.ScopeExec
	case ToolListSnapshots:
		return store.ScopeRead
	case ToolReadFile, ToolWriteFile, ToolListFiles:
		return store.ScopeFiles
	case ToolSandboxStatus, ToolProcesses:
		return store.ScopeRead
	}
	return store.ScopeAdmin
}

// schemaCache is shared by every server this process builds: Handler builds one per HTTP request, and without
// it each would infer and resolve the same output schemas again.
var schemaCache = mcp.NewSchemaCache()

// New returns an MCP server whose tools act on key's sandbox through b. key must come from sandkeep.NewKey; a
// zero key makes every tool fail with INVALID_IDENTITY.
func New(b service.Backend, key sandkeep.Key, opts Options) *mcp.Server {
	return newServer(&tools{b: b, key: key, opts: opts.withDefaults()})
}

func newServer(t *tools) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "sandkeep", Title: "sandkeep sandbox", Version: t.opts.Version},
		&mcp.ServerOptions{
			Instructions: instructions,
			Logger:       t.opts.Logger,
			SchemaCache:  schemaCache,
			// Tools are the only feature; not advertising logging keeps clients from asking for it.
			Capabilities: &mcp.ServerCapabilities{},
		})
	t.register(s)
	s.AddReceivingMiddleware(toolErrors)
	return s
}

// instructions tell the model what the tools act on.
const instructions = "These tools act on one persistent Linux sandbox that belongs to you alone. Files live " +
	"under /workspace (relative paths are relative to it) and persist between calls and sessions; the first exec " +
	"creates the sandbox. A command that exits non-zero is a normal result: read exit_code, stdout and stderr. " +
	"A failed call returns CODE: message (hint: what to do)."

// ServeStdio serves key's tools over stdin and stdout until the client disconnects or ctx ends. Nothing else may
// write to stdout meanwhile: it carries the protocol.
func ServeStdio(ctx context.Context, b service.Backend, key sandkeep.Key, opts Options) error {
	if key.IsZero() {
		return fault.New(fault.InvalidIdentity, "pass --tenant and --user", "no tenant and user to serve")
	}
	return New(b, key, opts).Run(ctx, &mcp.StdioTransport{})
}

// Handler serves MCP over streamable HTTP. keyFor names the sandbox of each request (the tenant from its
// already-authenticated token, the user from a header or the path); when it fails, the request is refused with
// JSON {code, message, hint} and a status that fits the code (401 UNAUTHENTICATED, 403 FORBIDDEN, 400 for a bad
// user, ...). The handler is stateless: every POST gets a server bound to its own request's key, so no session
// can be carried from one caller to another, and any instance behind a load balancer can answer.
func Handler(b service.Backend, keyFor func(*http.Request) (sandkeep.Key, error), opts Options) http.Handler {
	opts = opts.withDefaults()
	sdk := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		rs, _ := r.Context().Value(requestServerKey{}).(*requestServer)
		if rs == nil {
			return nil // not reached through Handler: the SDK answers 400
		}
		return rs.get()
	}, &mcp.StreamableHTTPOptions{
		Stateless:                    true,
		Logger:                       opts.Logger,
		MaxRequestBodyBytes:          maxBody(opts.MaxWriteBytes),
		PropagateRequestCancellation: true,
		// The SDK's DNS-rebinding guard refuses a request that reached a loopback address with another Host,
		// which is every request through a reverse proxy on the same machine. Rebinding buys a page nothing
		// here: every request needs a bearer token, checked before this handler, that a browser never adds.
		DisableLocalhostProtection: true,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := keyFor(r)
		if err == nil && key.IsZero() {
			err = fault.New(fault.Internal, "", "the server named no sandbox for this request")
		}
		if err != nil {
			writeHTTPError(w, err)
			return
		}
		t := &tools{b: b, key: key, opts: opts, requestCtx: r.Context()}
		if opts.Authorize != nil {
			t.authorize = func(tool string) error { return opts.Authorize(r, tool) }
		}
		if opts.RequestID != nil {
			t.requestID = opts.RequestID(r)
		}
		rs := &requestServer{tools: t}
		sdk.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestServerKey{}, rs)))
	})
}

// maxBody bounds an HTTP request body: room for write_file's largest content as a JSON string (up to 6 bytes
// per byte, for \u00XX escapes), and at least the SDK's default for everything else.
func maxBody(maxWrite int64) int64 {
	n := maxWrite*6 + 64<<10
	if n < mcp.DefaultMaxRequestBodyBytes {
		n = mcp.DefaultMaxRequestBodyBytes
	}
	return n
}

type requestServerKey struct{}

// requestServer builds a request's server once: the SDK asks for it twice per request (protocol version check,
// then the session).
type requestServer struct {
	tools *tools
	once  sync.Once
	s     *mcp.Server
}

func (rs *requestServer) get() *mcp.Server {
	rs.once.Do(func() { rs.s = newServer(rs.tools) })
	return rs.s
}
