package client

import (
	"bytes"
	"context"
	"encoding/json"

	"github.com/sandkeep/sandkeep/wire"
)

// Fork makes to, a new user of the token's tenant, a sandbox with a copy of user's workspace in user's template;
// user's sandbox keeps running, and later changes on either side stay apart. It needs the exec scope. A user
// without a sandbox is SANDBOX_NOT_FOUND, a to that has one SANDBOX_EXISTS, a copy past the quota or the tenant's
// sandbox bound QUOTA_EXCEEDED (nothing is made).
func (c *Client) Fork(ctx context.Context, user, to string) (Sandbox, error) {
	b, err := json.Marshal(wire.ForkRequest{To: to})
	if err != nil {
		return Sandbox{}, err
	}
	var sb Sandbox
	err = c.call(ctx, "POST", "/v1/sandboxes/"+escape(user)+"/fork", nil, bytes.NewReader(b), jsonBody(), &sb)
	return sb, err
}
