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

// ProbeImage returns an image built FROM the test image with skprobe, a static network client, at ProbePath (see
// ImageWithFiles: a changed probe gets a new image). Nothing is pulled.
func ProbeImage(t testing.TB) string {
	t.Helper()
	data, err := os.ReadFile(BuildBinary(t, "./internal/testutil/probe", "skprobe", false))
	if err != nil {
		t.Fatal(err)
	}
	return ImageWithFiles(t, TestImage(t), map[string]ImageFile{ProbePath: {Data: data, Mode: 0o755}})
}

// ImageFile is one file ImageWithFiles adds; Mode 0 is 0644.
type ImageFile struct {
	Data []byte
	Mode int64
}

// ImageWithFiles builds, under a tag derived from base and the files, an image FROM base with each file added
// (path in the image -> file). Parallel test processes share it; nothing is pulled.
func ImageWithFiles(t testing.TB, base string, files map[string]ImageFile) string {
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
		f := files[p]
		if f.Mode == 0 {
			f.Mode = 0o644
		}
		fmt.Fprintf(h, "\x00%s\x00%o\x00", p, f.Mode)
		h.Write(f.Data)
		name := fmt.Sprintf("f%d", i)
		fmt.Fprintf(&df, "COPY %s %s\n", name, p)
		if err := addFile(tw, name, f.Data, f.Mode); err != nil {
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
