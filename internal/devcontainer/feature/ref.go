// Package feature installs devcontainer features the way the devcontainers CLI does: each feature's files
// (devcontainer-feature.json, install.sh and whatever they ship) go into a derived image built FROM the
// sandbox's image, where install.sh runs as root at build time with the feature's options as environment.
//
// Features come from the repository (local, "./name" relative to devcontainer.json, inside .devcontainer) or
// from an OCI registry ("ghcr.io/devcontainers/features/go:1"). Both are untrusted: files are read through an
// os.Root (no symlinks, no special files, bounded), the metadata is parsed strictly (ParseMetadata), and what
// the metadata asks that would weaken the sandbox's posture (privileged, capAdd, securityOpt, entrypoint,
// a host bind the guard refuses, a deny-class variable) is dropped and reported as a Dropped, never obeyed.
//
// The derived image is built through internal/build (build.Builder): its RUN steps have no network, so an
// install.sh that downloads fails the build with the build's output; a feature for an offline sandbox ships
// what it installs. The image's tag is the build's digest of the generated Dockerfile (which names the base
// image and its ID), every feature's files and every option value, so the same inputs reuse the same image.
package feature

import (
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// Ref is a feature as devcontainer.json names it: a local directory or an OCI reference.
type Ref struct {
	ID string // as written in devcontainer.json

	Local string // a local feature: its directory, slash-separated, relative to the repository root

	Registry   string // an OCI feature: "ghcr.io", "127.0.0.1:5000"
	Repository string // "devcontainers/features/go"
	Tag        string // "1"; "latest" when neither tag nor digest is given
	Digest     string // "sha256:..."; wins over Tag when set
}

// IsLocal reports a feature from the repository.
func (r Ref) IsLocal() bool { return r.Local != "" }

// Resource names the feature without its version: the local directory, or registry/repository. installsAfter
// and dependsOn match on it.
func (r Ref) Resource() string {
	if r.IsLocal() {
		return r.Local
	}
	return r.Registry + "/" + r.Repository
}

// Reference is the OCI reference fetched: registry/repository@digest, else :tag.
func (r Ref) Reference() string {
	if r.Digest != "" {
		return r.Resource() + "@" + r.Digest
	}
	return r.Resource() + ":" + r.Tag
}

var (
	repoPart   = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)
	hostPart   = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?$`)
	tagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	digestPat  = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
)

// ParseRef reads a feature's name from devcontainer.json. dcDir is the directory of devcontainer.json relative
// to the repository root (slash-separated, "." for the root). A local feature must stay inside dcDir (as the
// devcontainers CLI requires); an OCI one is registry/namespace/name with a tag or a digest. A URL to a
// tarball ("https://...tgz") and the retired GitHub-release form are refused: they need a network at
// resolution time that sandkeep does not reach for. Errors are FEATURE_INVALID.
func ParseRef(id, dcDir string) (Ref, error) {
	r := Ref{ID: id}
	if id == "" || len(id) > 512 || strings.ContainsFunc(id, func(c rune) bool { return c < 0x21 || c == 0x7f }) {
		return r, invalid(id, "name a feature such as \"ghcr.io/devcontainers/features/go:1\" or \"./my-feature\"", "the name is empty, too long or has spaces or control characters")
	}
	if strings.HasPrefix(id, "./") || strings.HasPrefix(id, "../") {
		if dcDir == "" {
			dcDir = "."
		}
		rel := path.Clean(id)
		if rel == "." || strings.HasPrefix(rel, "../") || rel == ".." {
			return r, invalid(id, "put the feature in a directory inside .devcontainer/ and name it \"./that-directory\"", "a local feature must be a directory inside the folder of devcontainer.json")
		}
		r.Local = path.Join(dcDir, rel)
		return r, nil
	}
	if strings.Contains(id, "://") || strings.HasSuffix(id, ".tgz") {
		return r, invalid(id, "vendor the feature into .devcontainer/ (a directory with devcontainer-feature.json and install.sh) and name it \"./dir\"", "features fetched from a URL are not supported")
	}
	name := id
	if at := strings.LastIndex(name, "@"); at >= 0 {
		r.Digest, name = name[at+1:], name[:at]
		if !digestPat.MatchString(r.Digest) {
			return r, invalid(id, "pin with @sha256:<64 hex digits>", "the digest %q is not a sha256 digest", r.Digest)
		}
	}
	slash := strings.Index(name, "/")
	if slash < 0 {
		return r, invalid(id, "name the registry: \"ghcr.io/devcontainers/features/go:1\"", "the feature has no registry (the short form of the retired GitHub-release features is not supported)")
	}
	r.Registry, name = name[:slash], name[slash+1:]
	if c := strings.LastIndex(name, ":"); c >= 0 && r.Digest == "" {
		r.Tag, name = name[c+1:], name[:c]
		if !tagPattern.MatchString(r.Tag) {
			return r, invalid(id, "give a tag such as :1 or :latest", "the tag %q is not an OCI tag", r.Tag)
		}
	} else if c >= 0 {
		return r, invalid(id, "give a tag or a digest, not both", "the feature has both a tag and a digest")
	}
	if r.Tag == "" && r.Digest == "" {
		r.Tag = "latest"
	}
	if !hostPart.MatchString(r.Registry) || !strings.ContainsAny(r.Registry, ".:") && r.Registry != "localhost" {
		return r, invalid(id, "name the registry host first: \"ghcr.io/owner/features/name:1\"", "%q is not a registry host", r.Registry)
	}
	for _, part := range strings.Split(name, "/") {
		if !repoPart.MatchString(part) {
			return r, invalid(id, "use lower-case letters, digits and . _ - in the repository path", "the repository path %q is not an OCI repository name", name)
		}
	}
	r.Repository = name
	return r, nil
}

func invalid(id, hint, format string, args ...any) error {
	return fault.New(fault.FeatureInvalid, hint, "feature %q: %s", id, fmt.Sprintf(format, args...))
}
