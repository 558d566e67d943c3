// Package ocireg runs an OCI registry for tests (in process, on loopback) and pushes devcontainer features to it.
// It is its own package so that only the tests that need a registry link one.
package ocireg

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory" // the registry's storage
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sirupsen/logrus"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry/remote"
)

// Registry runs a distribution (github.com/distribution/distribution/v3) registry in this process, in memory,
// on 127.0.0.1 (httptest), and returns its host:port. It stops when the test ends.
func Registry(t testing.TB) string {
	t.Helper()
	cfg := &configuration.Configuration{
		Storage: configuration.Storage{
			"inmemory":    configuration.Parameters{},
			"maintenance": configuration.Parameters{"uploadpurging": map[any]any{"enabled": false}},
		},
	}
	cfg.Log.AccessLog.Disabled = true
	logrus.SetLevel(logrus.ErrorLevel) // the registry logs every request through logrus's standard logger
	app := handlers.NewApp(context.Background(), cfg)
	srv := httptest.NewServer(app)
	t.Cleanup(func() {
		srv.Close()
		_ = app.Shutdown()
	})
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// PushFeature pushes a devcontainer feature (files at the root of its layer) to ref ("127.0.0.1:port/repo:tag")
// over plain HTTP, the way `devcontainer features publish` lays it out: an empty config and one layer of media
// type application/vnd.devcontainers.layer.v1+tar. It returns the manifest's digest.
func PushFeature(t testing.TB, ref string, files map[string]string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, name := range sortedKeys(files) {
		mode := int64(0o644)
		if name == "install.sh" {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Name: "./" + name, Mode: mode, Size: int64(len(files[name])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(files[name])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	repo, err := remote.NewRepository(ref)
	if err != nil {
		t.Fatal(err)
	}
	repo.PlainHTTP = true
	push := func(mediaType string, data []byte) ocispec.Descriptor {
		d := content.NewDescriptorFromBytes(mediaType, data)
		if err := repo.Push(ctx, d, bytes.NewReader(data)); err != nil {
			t.Fatalf("push %s to %s: %v", mediaType, ref, err)
		}
		return d
	}
	cfg := push("application/vnd.devcontainers", []byte("{}"))
	lay := push("application/vnd.devcontainers.layer.v1+tar", layer.Bytes())
	man, err := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: cfg, Layers: []ocispec.Descriptor{lay}})
	if err != nil {
		t.Fatal(err)
	}
	md := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, man)
	if err := repo.PushReference(ctx, md, bytes.NewReader(man), repo.Reference.Reference); err != nil {
		t.Fatalf("push manifest %s: %v", ref, err)
	}
	return digest.Digest(md.Digest).String()
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
