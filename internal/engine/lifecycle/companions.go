package lifecycle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// ensureCompanions makes the shape's compose companions run next to sb, with sb's posture (user, capabilities,
// seccomp, limits). The driver stops and removes them with the sandbox. A driver without
// driver.CompanionRunner refuses the shape rather than running the sandbox without its services.
//
// A sandbox reused as this process last ensured it, with the same companions, is not inspected again: the
// companions were ensured with it (they are started again whenever the sandbox is started, created or recreated),
// so a command costs no engine call per companion.
func (m *Manager) ensureCompanions(ctx context.Context, key identity.Key, sh *Shape, sb *driver.Sandbox, d Decision) error {
	cr, ok := m.drv.(driver.CompanionRunner)
	if !ok {
		return fault.New(fault.SpecUnsupported, "run the compose-based devcontainer on the Docker driver, or give it an image without services",
			"the compose file's runServices need a driver that runs companion containers, and %s does not", m.drv.Name())
	}
	p, _, err := m.postureOf(key, sh)
	if err != nil {
		return err
	}
	seen := companionsSeen{sandbox: sb.ID, hash: p.Companions}
	if v, ok := m.comps.Load(key.Hex()); ok && d == DecisionReuse && v.(companionsSeen) == seen {
		return nil
	}
	m.comps.Delete(key.Hex())
	if err := cr.EnsureCompanions(ctx, sb, p, sh.cfg.Companions); err != nil {
		return err
	}
	m.comps.Store(key.Hex(), seen)
	return nil
}

// companionsSeen is the sandbox container and the companions' hash this process last ensured for a key.
type companionsSeen struct {
	sandbox, hash string
}

// companionsHash is the hex SHA-256 of the companions' definitions as the driver gets them, "" for none.
func companionsHash(cs []driver.Companion) string {
	if len(cs) == 0 {
		return ""
	}
	b, err := json.Marshal(cs)
	if err != nil {
		panic("companions are always marshalable: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
