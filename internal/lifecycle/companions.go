package lifecycle

import (
	"context"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// ensureCompanions makes the shape's compose companions run next to sb, with sb's posture (user, capabilities,
// seccomp, limits). The driver stops and removes them with the sandbox. A driver without
// driver.CompanionRunner refuses the shape rather than running the sandbox without its services.
func (m *Manager) ensureCompanions(ctx context.Context, key identity.Key, sh *Shape, sb *driver.Sandbox) error {
	cr, ok := m.drv.(driver.CompanionRunner)
	if !ok {
		return fault.New(fault.SpecUnsupported, "run the compose-based devcontainer on the Docker driver, or give it an image without services",
			"the compose file's runServices need a driver that runs companion containers, and %s does not", m.drv.Name())
	}
	p, _, err := m.postureOf(key, sh)
	if err != nil {
		return err
	}
	return cr.EnsureCompanions(ctx, sb, p, sh.cfg.Companions)
}
