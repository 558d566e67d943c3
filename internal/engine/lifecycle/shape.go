package lifecycle

import (
	"github.com/sandkeep/sandkeep/internal/fault"
)

// EnvTemplate is the variable a sandbox made for an operator template finds the template's name in.
const EnvTemplate = "SANDKEEP_TEMPLATE"

// Shape is what a key's sandbox should be: the Manager's Config with a run's own sandbox fields applied (an
// operator template's, a repository spec's image, env, mounts, limits and post-create). A key's sandbox made
// for another shape has drifted (its image or posture differ) and is recycled by the next command.
//
// A Shape is immutable once made and safe for concurrent use; it caches each key's posture.
type Shape struct {
	// Template is the operator template the shape was made from ("" for none): a label on the sandbox and part
	// of its posture.
	Template string

	cfg      Config
	uid, gid int
	postures *keyCache[keyPosture] // built once per key (see postureOf), at most MaxKeys
}

// NewShape returns the Manager's Config changed by edit, validated as New validates a Config. Only the
// sandbox's own fields (Image, User, AllowRoot, limits, Env, Mounts, Tmpfs, PostCreate, the workspace quota) may be
// edited (the quota within the operator's DiskMax*): the
// others belong to the Manager and are put back.
func (m *Manager) NewShape(template string, edit func(*Config)) (*Shape, error) {
	cfg := m.cfg
	cfg.Env, cfg.Mounts = append([]string(nil), cfg.Env...), append(cfg.Mounts[:0:0], cfg.Mounts...)
	tmpfs := make(map[string]string, len(cfg.Tmpfs))
	for k, v := range cfg.Tmpfs {
		tmpfs[k] = v
	}
	cfg.Tmpfs = tmpfs
	if edit != nil {
		edit(&cfg)
	}
	own := m.cfg
	own.Image, own.User, own.AllowRoot = cfg.Image, cfg.User, cfg.AllowRoot
	own.PidsLimit, own.MemoryBytes, own.NanoCPUs, own.TmpBytes, own.HomeBytes = cfg.PidsLimit, cfg.MemoryBytes, cfg.NanoCPUs, cfg.TmpBytes, cfg.HomeBytes
	own.RequestMemoryBytes, own.RequestNanoCPUs = cfg.RequestMemoryBytes, cfg.RequestNanoCPUs
	own.Env, own.Mounts, own.Tmpfs, own.PostCreate = cfg.Env, cfg.Mounts, cfg.Tmpfs, cfg.PostCreate
	own.PostStart, own.WorkspaceFolder, own.Volumes = cfg.PostStart, cfg.WorkspaceFolder, cfg.Volumes
	own.DiskBytes, own.DiskInodes = cfg.DiskBytes, cfg.DiskInodes
	own.Companions = cfg.Companions
	own.HomeDir = cfg.HomeDir
	own.setDefaults()
	uid, gid, err := own.validate()
	if err != nil {
		return nil, err
	}
	if template != "" && !ValidTemplateName(template) {
		return nil, fault.New(fault.InvalidArgument, "name templates with letters, digits, '-', '_' and '.'",
			"template name %q is not valid", template)
	}
	return &Shape{Template: template, cfg: own, uid: uid, gid: gid, postures: newKeyCache[keyPosture](m.cfg.MaxKeys)}, nil
}

// Image is the image ref the shape's sandboxes run.
func (s *Shape) Image() string { return s.cfg.Image }

// shapeOf is sh, or the Manager's own shape when sh is nil.
func (m *Manager) shapeOf(sh *Shape) *Shape {
	if sh == nil {
		return m.def
	}
	return sh
}

// ValidTemplateName reports whether s names a template: 1..64 of [A-Za-z0-9._-], not starting with '.' or '-'.
func ValidTemplateName(s string) bool {
	if s == "" || len(s) > 64 || s[0] == '.' || s[0] == '-' {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		default:
			return false
		}
	}
	return true
}
