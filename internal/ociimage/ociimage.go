// Package ociimage writes a single-layer image FROM scratch as an archive that `ctr images import`, `docker load`
// and registry tools (skopeo, crane, oras) read: an OCI image layout (oci-layout, index.json, blobs/sha256/...)
// that also carries Docker's manifest.json. It is how sandkeep ships its agent image without a registry or a
// Docker daemon, and how the kubernetes driver's tests load images into a node's containerd.
package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Media types written.
const (
	MediaIndex    = "application/vnd.oci.image.index.v1+json"
	MediaManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaConfig   = "application/vnd.oci.image.config.v1+json"
	MediaLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// File is one entry of the image's only layer. Parent directories are added as needed (0755, root).
type File struct {
	Path string      // absolute path in the image, e.g. "/sandkeep-agent"
	Mode fs.FileMode // permission bits, plus fs.ModeDir or fs.ModeSymlink for those
	Data []byte      // a regular file's content
	Link string      // a symlink's target
	UID  int
	GID  int
}

// Image is what Write puts in the archive.
type Image struct {
	// Ref is the full name the importer tags the image with, e.g. "docker.io/library/sandkeep-agent:v1".
	Ref        string
	Files      []File
	Entrypoint []string
	Cmd        []string
	Env        []string
	User       string
	WorkingDir string
	Labels     map[string]string
	// Created is the image's creation time; zero means the Unix epoch, so that the same input gives the same
	// image ID.
	Created time.Time
}

// Result names what Write wrote.
type Result struct {
	ManifestDigest string // "sha256:..."
	ConfigDigest   string // the image ID as Docker and containerd show it
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Write writes img as an image archive to w.
func Write(w io.Writer, img Image) (Result, error) {
	repo, tag, err := splitRef(img.Ref)
	if err != nil {
		return Result{}, err
	}
	layer, err := layerTar(img.Files)
	if err != nil {
		return Result{}, err
	}
	layerDigest := digest(layer)
	created := img.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	config, err := json.Marshal(map[string]any{
		"created":      created.UTC().Format(time.RFC3339),
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Entrypoint": img.Entrypoint, "Cmd": img.Cmd, "Env": img.Env, "User": img.User,
			"WorkingDir": img.WorkingDir, "Labels": img.Labels,
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
		"history": []map[string]any{{"created": created.UTC().Format(time.RFC3339), "created_by": "sandkeep ociimage"}},
	})
	if err != nil {
		return Result{}, err
	}
	configDigest := digest(config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     MediaManifest,
		"config":        descriptor{MediaType: MediaConfig, Digest: configDigest, Size: int64(len(config))},
		"layers":        []descriptor{{MediaType: MediaLayer, Digest: layerDigest, Size: int64(len(layer))}},
	})
	if err != nil {
		return Result{}, err
	}
	manifestDigest := digest(manifest)
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     MediaIndex,
		"manifests": []descriptor{{
			MediaType: MediaManifest, Digest: manifestDigest, Size: int64(len(manifest)),
			Annotations: map[string]string{
				"io.containerd.image.name":          img.Ref,
				"org.opencontainers.image.ref.name": tag,
			},
			Platform: &platform{Architecture: runtime.GOARCH, OS: "linux"},
		}},
	})
	if err != nil {
		return Result{}, err
	}
	// Docker's `docker load` reads manifest.json; the blob paths serve both formats.
	dockerManifest, err := json.Marshal([]map[string]any{{
		"Config":   blobPath(configDigest),
		"RepoTags": []string{repo + ":" + tag},
		"Layers":   []string{blobPath(layerDigest)},
	}})
	if err != nil {
		return Result{}, err
	}

	tw := tar.NewWriter(w)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{"manifest.json", dockerManifest},
		{blobPath(layerDigest), layer},
		{blobPath(configDigest), config},
		{blobPath(manifestDigest), manifest},
	}
	dirs := []string{"blobs/", "blobs/sha256/"}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: created}); err != nil {
			return Result{}, err
		}
	}
	for _, e := range entries {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: created}
		if err := tw.WriteHeader(hdr); err != nil {
			return Result{}, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return Result{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return Result{}, err
	}
	return Result{ManifestDigest: manifestDigest, ConfigDigest: configDigest}, nil
}

func blobPath(d string) string { return "blobs/sha256/" + strings.TrimPrefix(d, "sha256:") }

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// splitRef splits "host/repo:tag" into repo and tag; a ref without a tag, or with a digest, is refused.
func splitRef(ref string) (repo, tag string, err error) {
	if strings.Contains(ref, "@") {
		return "", "", fmt.Errorf("image ref %q: give a tag, not a digest (the digest is the archive's own)", ref)
	}
	i := strings.LastIndex(ref, ":")
	if i <= 0 || strings.Contains(ref[i:], "/") || i == len(ref)-1 {
		return "", "", fmt.Errorf("image ref %q has no tag (e.g. sandkeep-agent:v1)", ref)
	}
	return ref[:i], ref[i+1:], nil
}

// layerTar writes files, with their parent directories, sorted by path.
func layerTar(files []File) ([]byte, error) {
	byPath := map[string]File{}
	for _, f := range files {
		p := path.Clean("/" + f.Path)
		if p == "/" || p != "/"+strings.TrimPrefix(f.Path, "/") {
			return nil, fmt.Errorf("layer path %q is not a clean absolute path", f.Path)
		}
		if _, dup := byPath[p]; dup {
			return nil, fmt.Errorf("layer path %q given twice", f.Path)
		}
		f.Path = p
		byPath[p] = f
	}
	for p := range byPath {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = File{Path: d, Mode: fs.ModeDir | 0o755}
			} else if !byPath[d].Mode.IsDir() {
				return nil, fmt.Errorf("layer path %q is under %q, which is not a directory", p, d)
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		f := byPath[p]
		hdr := &tar.Header{Name: strings.TrimPrefix(p, "/"), Mode: int64(f.Mode.Perm()), Uid: f.UID, Gid: f.GID,
			ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		switch {
		case f.Mode.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		case f.Mode&fs.ModeSymlink != 0:
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, f.Link
		case f.Mode.IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.Data))
		default:
			return nil, fmt.Errorf("layer path %q: only files, directories and symlinks", p)
		}
		if f.Mode&fs.ModeSticky != 0 {
			hdr.Mode |= 0o1000
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
