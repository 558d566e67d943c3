package testutil

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/gofrs/flock"
	"github.com/moby/moby/api/types/build"
	"github.com/moby/moby/client"
)

// DefaultTestImage is the tag TestImage builds unless SANDKEEP_TEST_IMAGE names another.
const DefaultTestImage = "sandkeep-test-busybox:latest"

// EnvTestImage names the variable that overrides DefaultTestImage.
const EnvTestImage = "SANDKEEP_TEST_IMAGE"

// LabelVariant is the label ImageVariant sets to make an image with a different ID.
const LabelVariant = "io.sandkeep.test.variant"

// SandboxUID and SandboxGID are the ids of the `sandbox` user in the test image.
const (
	SandboxUID = 1000
	SandboxGID = 1000
)

// testImageDockerfile: the rootfs is copied as root; the sandbox user's home and /workspace belong to it.
// (The classic builder ignores ownership in the context tar, hence the --chown lines.)
const testImageDockerfile = `FROM scratch
COPY rootfs/ /
COPY --chown=1000:1000 home-sandbox/ /home/sandbox/
COPY --chown=1000:1000 workspace/ /workspace/
CMD ["/bin/sh"]
`

const (
	etcPasswd = "root:x:0:0:root:/root:/bin/sh\n" +
		"sandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
	etcGroup = "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n"
)

var testImageMu sync.Mutex

// TestImage returns the ref of a runnable test image: "sandkeep-test-busybox:latest", or $SANDKEEP_TEST_IMAGE.
// When the engine does not have it, it is built through the Engine API, FROM scratch, with the host's static
// busybox at /bin/busybox and a /bin symlink per applet, /etc/passwd and /etc/group with root and `sandbox`
// (uid/gid 1000, home /home/sandbox), /tmp (1777) and /workspace (owned by sandbox). No registry is contacted.
//
// Test processes running in parallel serialize the build with a file lock in os.TempDir().
func TestImage(t testing.TB) string {
	t.Helper()
	cli := Docker(t)
	ref := os.Getenv(EnvTestImage)
	if ref == "" {
		ref = DefaultTestImage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := ensureTestImage(ctx, cli, ref); err != nil {
		t.Fatalf("test image %s: %v", ref, err)
	}
	return ref
}

func ensureTestImage(ctx context.Context, cli *client.Client, ref string) error {
	if ok, err := imageExists(ctx, cli, ref); err != nil || ok {
		return err
	}
	testImageMu.Lock()
	defer testImageMu.Unlock()
	lock := flock.New(filepath.Join(os.TempDir(), "sandkeep-test-image.lock"))
	locked, err := lock.TryLockContext(ctx, 100*time.Millisecond)
	if err != nil || !locked {
		return fmt.Errorf("lock %s: locked=%v: %w", lock.Path(), locked, err)
	}
	defer func() { _ = lock.Unlock() }()
	// Another process may have built it while we waited.
	if ok, err := imageExists(ctx, cli, ref); err != nil || ok {
		return err
	}
	buildCtx, err := testImageContext()
	if err != nil {
		return err
	}
	return buildImage(ctx, cli, buildCtx, ref)
}

func imageExists(ctx context.Context, cli *client.Client, ref string) (bool, error) {
	_, err := cli.ImageInspect(ctx, ref)
	switch {
	case err == nil:
		return true, nil
	case cerrdefs.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("inspect image %s: %w", ref, err)
	}
}

// ImageVariant builds, under tag, an image FROM the test image plus LABEL io.sandkeep.test.variant=label: the
// same filesystem with a different image ID (to exercise image drift). It returns the new image's ID and removes
// the tag when the test ends. The base is never pulled. The tag must be unique to the test (parallel test
// processes share one engine); the same tag and label give the same ID again within the test.
func ImageVariant(t testing.TB, tag, label string) string {
	t.Helper()
	base := TestImage(t)
	cli := Docker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The tag goes into a label too: the build cache would otherwise give two tests that ask for the same label
	// the very same image, and the first test's cleanup would delete the other's image mid-test.
	dockerfile := fmt.Sprintf("FROM %s\nLABEL %s=%s %s=%s\n", base,
		LabelVariant, strconvQuote(label), LabelVariant+".tag", strconvQuote(tag))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := addFile(tw, "Dockerfile", []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Force: untag even while a (not yet removed) container still uses the image.
		_, err := cli.ImageRemove(ctx, tag, client.ImageRemoveOptions{Force: true, PruneChildren: true})
		if err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("cleanup: remove image %s: %v", tag, err)
		}
	})
	if err := buildImage(ctx, cli, &buf, tag); err != nil {
		t.Fatalf("image variant %s: %v", tag, err)
	}
	img, err := cli.ImageInspect(ctx, tag)
	if err != nil {
		t.Fatalf("image variant %s: %v", tag, err)
	}
	return img.ID
}

// strconvQuote quotes a LABEL value for a Dockerfile (JSON string quoting is what the parser accepts).
func strconvQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// buildImage runs a classic-builder build (never pulling the base) and reads the progress stream to its end,
// failing on an error message in it.
func buildImage(ctx context.Context, cli *client.Client, buildCtx io.Reader, tag string) error {
	res, err := cli.ImageBuild(ctx, buildCtx, client.ImageBuildOptions{
		Tags:        []string{tag},
		Dockerfile:  "Dockerfile",
		Remove:      true,
		ForceRemove: true,
		PullParent:  false,
		Version:     build.BuilderV1,
	})
	if err != nil {
		return fmt.Errorf("build %s: %w", tag, err)
	}
	defer res.Body.Close()
	var log strings.Builder
	dec := json.NewDecoder(res.Body)
	for {
		var msg struct {
			Stream      string `json:"stream"`
			Status      string `json:"status"`
			Error       string `json:"error"` // deprecated by the engine, still sent by old ones
			ErrorDetail *struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("build %s: read progress: %w\n%s", tag, err, log.String())
		}
		log.WriteString(msg.Stream)
		if msg.Status != "" {
			log.WriteString(msg.Status + "\n")
		}
		if msg.ErrorDetail != nil && msg.ErrorDetail.Message != "" {
			return fmt.Errorf("build %s: %s\n%s", tag, msg.ErrorDetail.Message, log.String())
		}
		if msg.Error != "" {
			return fmt.Errorf("build %s: %s\n%s", tag, msg.Error, log.String())
		}
	}
	if ok, err := imageExists(ctx, cli, tag); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("build %s: finished without an image\n%s", tag, log.String())
	}
	return nil
}

// testImageContext returns the build context (a tar) of the test image.
func testImageContext() (io.Reader, error) {
	bb, err := staticBusybox()
	if err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(bb)
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", bb, err)
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := []struct {
		name string
		mode int64
	}{
		{"rootfs", 0o755}, {"rootfs/bin", 0o755}, {"rootfs/etc", 0o755}, {"rootfs/root", 0o700},
		{"rootfs/tmp", 0o1777}, {"rootfs/usr", 0o755}, {"rootfs/usr/bin", 0o755},
		{"home-sandbox", 0o755}, {"workspace", 0o755},
	}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d.name + "/", Mode: d.mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := addFile(tw, "Dockerfile", []byte(testImageDockerfile), 0o644); err != nil {
		return nil, err
	}
	if err := addFile(tw, "rootfs/bin/busybox", bin, 0o755); err != nil {
		return nil, err
	}
	if err := addFile(tw, "rootfs/etc/passwd", []byte(etcPasswd), 0o644); err != nil {
		return nil, err
	}
	if err := addFile(tw, "rootfs/etc/group", []byte(etcGroup), 0o644); err != nil {
		return nil, err
	}
	links := []string{"rootfs/usr/bin/env"}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		links = append(links, "rootfs/bin/"+applet)
	}
	for _, l := range links {
		h := &tar.Header{Typeflag: tar.TypeSymlink, Name: l, Linkname: "/bin/busybox", Mode: 0o777, ModTime: epoch}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return &buf, nil
}

// epoch is a fixed mtime, so identical inputs make identical build contexts.
var epoch = time.Unix(0, 0)

func addFile(tw *tar.Writer, name string, data []byte, mode int64) error {
	h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

// staticBusybox finds a statically linked busybox on the host: /bin/busybox, else the one on PATH.
func staticBusybox() (string, error) {
	candidates := []string{"/bin/busybox"}
	if p, err := exec.LookPath("busybox"); err == nil {
		candidates = append(candidates, p)
	}
	var problems []string
	for _, c := range candidates {
		err := checkStatic(c)
		if err == nil {
			return c, nil
		}
		problems = append(problems, err.Error())
	}
	return "", fmt.Errorf("no static busybox found (%s); install busybox-static (scripts/docker-up.sh does)",
		strings.Join(problems, "; "))
}

// checkStatic fails unless path is an ELF executable without a program interpreter (PT_INTERP): a FROM scratch
// image has no dynamic loader.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", path)
		}
	}
	return nil
}

// RemoveImage force-removes ref (an image a test built); an image already gone is fine.
func RemoveImage(t testing.TB, ref string) {
	t.Helper()
	if ref == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := Docker(t).ImageRemove(ctx, ref, client.ImageRemoveOptions{Force: true, PruneChildren: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		t.Errorf("remove image %s: %v", ref, err)
	}
}
