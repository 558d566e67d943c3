package testutil

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
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
