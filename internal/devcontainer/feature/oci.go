package feature

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// LayerMediaType is the media type of a feature's one layer, a tar of its directory, as the devcontainers CLI
// publishes it.
const LayerMediaType = "application/vnd.devcontainers.layer.v1+tar"

// MaxManifestBytes bounds a feature's manifest.
const MaxManifestBytes = 4 << 20

// Registry fetches OCI features with oras-go. The zero value is ready: HTTPS, anonymous, except that a
// loopback registry (127.0.0.0/8, ::1, localhost) is spoken to over plain HTTP, as Docker does.
type Registry struct {
	// Client, when set, makes the requests (credentials, proxies); nil: oras-go's default client.
	Client remote.Client
}

var _ Fetcher = (*Registry)(nil)

// Fetch resolves ref's tag (or digest), reads its manifest and the feature's layer (bounded, digests checked),
// and returns the layer's files and the manifest's digest. Failures are FEATURE_UNAVAILABLE naming the feature
// and the registry (unreachable, not found, refused), FEATURE_INVALID for an artifact that is not a feature,
// or wrap ctx's cause.
func (r *Registry) Fetch(ctx context.Context, ref Ref) ([]File, string, error) {
	repo, err := remote.NewRepository(ref.Reference())
	if err != nil {
		return nil, "", invalid(ref.ID, "name the feature as registry/namespace/name:tag", "%v", err)
	}
	repo.PlainHTTP = loopback(ref.Registry)
	if r.Client != nil {
		repo.Client = r.Client
	}
	unavailable := func(err error, what string) error {
		if ctx.Err() != nil {
			return fmt.Errorf("feature %q: %w", ref.ID, context.Cause(ctx))
		}
		return fault.Wrap(err, fault.FeatureUnavailable,
			"make "+ref.Registry+" reachable from this host, or vendor the feature into .devcontainer/ and name it \"./dir\"",
			"feature %q: %s from registry %s failed: %v", ref.ID, what, ref.Registry, err)
	}
	reference := ref.Tag
	if ref.Digest != "" {
		reference = ref.Digest
	}
	desc, rc, err := repo.FetchReference(ctx, reference)
	if err != nil {
		return nil, "", unavailable(err, "fetching the manifest of "+ref.Reference())
	}
	if desc.Size > MaxManifestBytes {
		rc.Close()
		return nil, "", invalid(ref.ID, "publish the feature with the devcontainers CLI", "the manifest is %d bytes", desc.Size)
	}
	raw, err := content.ReadAll(rc, desc)
	rc.Close()
	if err != nil {
		return nil, "", unavailable(err, "reading the manifest of "+ref.Reference())
	}
	var man ocispec.Manifest
	if err := json.Unmarshal(raw, &man); err != nil || len(man.Layers) == 0 {
		return nil, "", invalid(ref.ID, "publish the feature with `devcontainer features publish`", "%s is not a feature's manifest (media type %q)", ref.Reference(), desc.MediaType)
	}
	layer := man.Layers[0]
	for _, l := range man.Layers {
		if l.MediaType == LayerMediaType {
			layer = l
			break
		}
	}
	if layer.Size > MaxFeatureBytes {
		return nil, "", invalid(ref.ID, "publish a smaller feature", "its layer is %d bytes, over %d", layer.Size, MaxFeatureBytes)
	}
	blob, err := content.FetchAll(ctx, repo, layer)
	if err != nil {
		return nil, "", unavailable(err, "fetching the layer of "+ref.Reference())
	}
	files, err := untar(blob)
	if err != nil {
		return nil, "", fault.Wrap(err, fault.FeatureInvalid, "publish the feature with `devcontainer features publish`",
			"feature %q: its layer: %v", ref.ID, err)
	}
	return files, desc.Digest.String(), nil
}

// loopback reports a registry host on the loopback interface.
func loopback(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// untar reads a feature's layer (a tar, optionally gzipped): regular files and directories only, every name
// clean and inside the archive, bounded.
func untar(blob []byte) ([]File, error) {
	var rd io.Reader = bytes.NewReader(blob)
	if len(blob) > 2 && blob[0] == 0x1f && blob[1] == 0x8b {
		zr, err := gzip.NewReader(rd)
		if err != nil {
			return nil, err
		}
		rd = io.LimitReader(zr, MaxFeatureBytes+1)
	}
	tr := tar.NewReader(rd)
	var files []File
	seen := map[string]bool{}
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		name := strings.TrimPrefix(path.Clean("/"+strings.TrimPrefix(h.Name, "./")), "/")
		if strings.Contains(h.Name, "..") && name != path.Clean(strings.TrimPrefix(h.Name, "./")) {
			return nil, fmt.Errorf("entry %q leaves the archive", short(h.Name))
		}
		switch h.Typeflag {
		case tar.TypeDir:
			continue
		case tar.TypeReg:
		default:
			return nil, fmt.Errorf("entry %q is not a regular file or directory", short(h.Name))
		}
		if name == "" || name == "." || seen[name] {
			return nil, fmt.Errorf("entry %q is empty or repeated", short(h.Name))
		}
		if len(files) == MaxFeatureFiles {
			return nil, fmt.Errorf("more than %d files", MaxFeatureFiles)
		}
		data, err := io.ReadAll(io.LimitReader(tr, MaxFeatureBytes-total+1))
		if err != nil {
			return nil, err
		}
		if total += int64(len(data)); total > MaxFeatureBytes {
			return nil, fmt.Errorf("more than %d bytes", MaxFeatureBytes)
		}
		seen[name] = true
		files = append(files, File{Path: name, Mode: h.FileInfo().Mode().Perm(), Data: data})
	}
}
