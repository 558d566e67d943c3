package lifecycle

import (
	"context"
	"slices"
	"strings"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/events"
)

// imageEnver is the optional driver capability of reading an image's configured environment (its ENV lines).
type imageEnver interface {
	ImageEnv(ctx context.Context, ref string) ([]string, error)
}

// imageEnvPlanted says, for a sandbox just created from image (imageID), which variables its image configures:
// every command in it starts with them, under the sandbox's own environment (env, the posture's), which
// replaces those of the same name. Names only. Nothing is said for an image without ENV, or on a driver that
// cannot read an image's environment; a failed read is logged and the sandbox runs as made.
func (m *Manager) imageEnvPlanted(ctx context.Context, sb *driver.Sandbox, image, imageID string, env []string) {
	ie, ok := m.drv.(imageEnver)
	if !ok {
		return
	}
	ref := imageID
	if ref == "" {
		ref = image
	}
	lines, err := ie.ImageEnv(ctx, ref)
	if err != nil {
		m.cfg.Logger.Debug("read the image's environment", "image", image, "err", err)
		return
	}
	if len(lines) == 0 {
		return
	}
	own := map[string]bool{}
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		own[k] = true
	}
	ev := events.ImageEnvPlanted{Sandbox: sb.Name, Image: image}
	for _, kv := range lines {
		k, _, _ := strings.Cut(kv, "=")
		if k == "" || slices.Contains(ev.Names, k) {
			continue
		}
		ev.Names = append(ev.Names, k)
		if own[k] {
			ev.Overridden = append(ev.Overridden, k)
		}
	}
	slices.Sort(ev.Names)
	slices.Sort(ev.Overridden)
	m.emit(ctx, events.NameImageEnvPlanted, ev)
}
