package engine

import (
	"context"
	"fmt"
	"strconv"

	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// ForwardPort is one of the repository's devcontainer.json forwardPorts and what port forwarding does with it
// (`sandkeep port-forward` with no port, GET /v1/sandboxes/{user}/ports, doctor). A forward always connects to
// 127.0.0.1:Port inside the sandbox's own network namespace, from the local Port: a bare port,
// "localhost:PORT" and "127.0.0.1:PORT" are forwarded; "SERVICE:PORT" is forwarded when SERVICE is the
// compose service the sandbox is, or one of its companions (runServices), which share the sandbox's loopback
// and are reached there exactly as its commands reach them. Anything else is not forwarded, and Why says why:
// the sandbox has no route to another host, and a forward never gives it one.
type ForwardPort struct {
	Entry     string `json:"entry"`               // as devcontainer.json writes it: 3000, "localhost:3000", "db:5432"
	Port      int    `json:"port,omitempty"`      // the port inside the sandbox and the local one; 0 when Entry is not a port
	Companion string `json:"companion,omitempty"` // the compose companion listening on Port, for "SERVICE:PORT"
	Forwarded bool   `json:"forwarded"`
	Why       string `json:"why,omitempty"` // why not, when not Forwarded
}

// String is the entry and its fate, one line: doctor's and the CLI's.
func (f ForwardPort) String() string {
	if f.Forwarded {
		s := fmt.Sprintf("%s -> 127.0.0.1:%d in the sandbox", strconv.Quote(f.Entry), f.Port)
		if f.Companion != "" {
			s += " (compose companion " + f.Companion + ")"
		}
		return s
	}
	return fmt.Sprintf("%s not forwarded: %s", strconv.Quote(f.Entry), f.Why)
}

// ForwardPorts are the forwardPorts of the repository key's runs follow (spec, else the template key's
// sandbox was made for, else the tenant's, else Config.Spec), each with what port forwarding does with it;
// nil when the repository has none. The repository is read as admission reads it: a file that is not valid
// is its SPEC_INVALID (or TIER_REFUSED) error. Nothing is forwarded here; DialPort does that per connection.
func (m *Manager) ForwardPorts(ctx context.Context, key Key, spec string) ([]ForwardPort, error) {
	tpl := ""
	if sb, err := m.Sandbox(ctx, key); err == nil {
		tpl = sb.Template
	} else if !fault.Is(err, fault.NotFound) {
		return nil, err
	}
	_, repo, err := m.shapeInputs(RunRequest{Key: key, Spec: spec, Template: tpl})
	if err != nil {
		return nil, err
	}
	return repo.forwardPorts(), nil
}

// forwardPorts decides each of the repository's forwardPorts entries.
func (r *repository) forwardPorts() []ForwardPort {
	if len(r.sb.ForwardPorts) == 0 {
		return nil
	}
	companions := map[string]bool{}
	for _, c := range r.companions {
		companions[c.Name] = true
	}
	out := make([]ForwardPort, 0, len(r.sb.ForwardPorts))
	taken := map[int]string{} // port -> the entry forwarded on it
	for _, e := range r.sb.ForwardPorts {
		fp := ForwardPort{Entry: e}
		p, err := devcontainer.ParseForwardPort(e)
		switch {
		case err != nil:
			fp.Why = err.Error() + `; write a port (3000) or "localhost:3000"`
		case p.Loopback() || (r.service != "" && p.Host == r.service):
			fp.Port, fp.Forwarded = p.Port, true
		case companions[p.Host]:
			fp.Port, fp.Companion, fp.Forwarded = p.Port, p.Host, true
		case p.Host == "::1":
			fp.Port = p.Port
			fp.Why = "a forward connects to 127.0.0.1 inside the sandbox, not to ::1; write " + strconv.Itoa(p.Port) + ` or "localhost:` + strconv.Itoa(p.Port) + `" for a server that listens on 127.0.0.1 or 0.0.0.0`
		default:
			fp.Port = p.Port
			fp.Why = p.Host + " is neither the sandbox nor one of its compose companions (runServices); a forward reaches only the sandbox's own loopback, and the sandbox has no route to another host"
		}
		if fp.Forwarded {
			if first, dup := taken[fp.Port]; dup {
				fp.Forwarded, fp.Companion = false, ""
				fp.Why = fmt.Sprintf("local port %d is already forwarded for %q", fp.Port, first)
			} else {
				taken[fp.Port] = e
			}
		}
		out = append(out, fp)
	}
	return out
}
