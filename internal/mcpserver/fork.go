package mcpserver

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/service"
)

// ToolFork copies this session's sandbox into a new user of the same tenant.
const ToolFork = "fork_sandbox"

// ForkInput is the fork_sandbox tool's input.
type ForkInput struct {
	To string `json:"to" jsonschema:"the user (of this session's tenant) to fork into: a new one, with no sandbox yet; a session for that user then works on the copy"`
}

// ForkOutput is the fork_sandbox tool's result.
type ForkOutput struct {
	Tenant   string `json:"tenant" jsonschema:"the tenant of both sandboxes"`
	User     string `json:"user" jsonschema:"the user the copy belongs to"`
	Name     string `json:"name" jsonschema:"the new sandbox's name"`
	State    string `json:"state" jsonschema:"the new sandbox's state, running once the fork is made"`
	Template string `json:"template,omitempty" jsonschema:"the template both sandboxes run"`
}

var forkTool = &mcp.Tool{
	Name: ToolFork, Title: "Fork the sandbox",
	Description: "Copy this sandbox's /workspace, in its template, into a new sandbox for another user of the same " +
		"tenant, to try something from this state without touching it. This sandbox keeps running; later changes " +
		"on either side stay apart.",
	Annotations: &mcp.ToolAnnotations{Title: "Fork the sandbox", OpenWorldHint: new(false)},
	InputSchema: inputSchema[ForkInput](nil),
}

func (t *tools) registerFork(s *mcp.Server) { mcp.AddTool(s, forkTool, handle(t, ToolFork, t.fork)) }

func (t *tools) fork(ctx context.Context, in ForkInput) (ForkOutput, error) {
	f, ok := t.b.(service.Forker)
	if !ok {
		return ForkOutput{}, service.ErrNoFork()
	}
	to, err := sandkeep.NewKey(t.key.Tenant, in.To)
	if err != nil {
		return ForkOutput{}, err
	}
	sb, err := f.Fork(ctx, t.key, to, service.AdmitRequest{RequestID: t.requestID})
	if err != nil {
		return ForkOutput{}, err
	}
	return ForkOutput{Tenant: sb.Tenant, User: sb.User, Name: sb.Name, State: sb.State, Template: sb.Template}, nil
}
