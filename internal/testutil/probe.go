package testutil

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// ProbePath is where ProbeImage puts skprobe (internal/testutil/probe) in the image.
const ProbePath = "/bin/skprobe"

// ProbeImage returns an image built FROM the test image with skprobe, a static network client, at ProbePath. Its
// tag carries a hash of the probe binary, so parallel test processes share it and a changed probe gets a new
// image. Nothing is pulled.
func ProbeImage(t testing.TB) string {
	t.Helper()
	base := TestImage(t)
	bin := BuildBinary(t, "./internal/testutil/probe", "skprobe", false)
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(append([]byte(base+"\x00"), data...))
	tag := "sandkeep-test-probe:" + hex.EncodeToString(sum[:6])
	cli := Docker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	testImageMu.Lock()
	defer testImageMu.Unlock()
	if ok, err := imageExists(ctx, cli, tag); err != nil {
		t.Fatal(err)
	} else if ok {
		return tag
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dockerfile := fmt.Sprintf("FROM %s\nCOPY skprobe %s\n", base, ProbePath)
	if err := addFile(tw, "Dockerfile", []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := addFile(tw, "skprobe", data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := buildImage(ctx, cli, &buf, tag); err != nil {
		t.Fatalf("probe image: %v", err)
	}
	return tag
}

// ImageWithFiles builds, under a tag derived from base and the files, an image FROM base with each file added
// (path in the image -> content, mode 0644). Parallel test processes share it; nothing is pulled.
func ImageWithFiles(t testing.TB, base string, files map[string][]byte) string {
	t.Helper()
	h := sha256.New()
	h.Write([]byte(base))
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	var df strings.Builder
	fmt.Fprintf(&df, "FROM %s\n", base)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, p := range paths {
		h.Write([]byte("\x00" + p + "\x00"))
		h.Write(files[p])
		name := fmt.Sprintf("f%d", i)
		fmt.Fprintf(&df, "COPY %s %s\n", name, p)
		if err := addFile(tw, name, files[p], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := addFile(tw, "Dockerfile", []byte(df.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	tag := "sandkeep-test-files:" + hex.EncodeToString(h.Sum(nil)[:6])
	cli := Docker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	testImageMu.Lock()
	defer testImageMu.Unlock()
	if ok, err := imageExists(ctx, cli, tag); err != nil {
		t.Fatal(err)
	} else if ok {
		return tag
	}
	if err := buildImage(ctx, cli, &buf, tag); err != nil {
		t.Fatalf("image with files: %v", err)
	}
	return tag
}
