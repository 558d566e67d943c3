package docker_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/build"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

var _ build.Builder = (*docker.Driver)(nil)

// countingEngine is the real client, counting the calls a build makes to the daemon.
type countingEngine struct {
	*client.Client
	inspects atomic.Int32
	builds   atomic.Int32
}

func (c *countingEngine) ImageInspect(ctx context.Context, ref string, opts ...client.ImageInspectOption) (client.ImageInspectResult, error) {
	c.inspects.Add(1)
	return c.Client.ImageInspect(ctx, ref, opts...)
}

func (c *countingEngine) ImageBuild(ctx context.Context, r io.Reader, opts client.ImageBuildOptions) (client.ImageBuildResult, error) {
	c.builds.Add(1)
	return c.Client.ImageBuild(ctx, r, opts)
}

func newBuildDriver(t *testing.T) (*docker.Driver, *countingEngine) {
	t.Helper()
	eng := &countingEngine{Client: testutil.Docker(t)}
	return docker.NewWithEngine(eng, docker.Options{}), eng
}

// buildRepo writes a repository whose files are unique to this test run (a nonce), so an image left behind by
// an earlier run is never a cache hit here.
func buildRepo(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	files["nonce.txt"] = fmt.Sprintf("%s %d\n", t.Name(), time.Now().UnixNano())
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// removeImage removes ref (and its untagged parents) when the test ends.
func removeImage(t *testing.T, ref string) {
	t.Helper()
	cli := testutil.Docker(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := cli.ImageRemove(ctx, ref, client.ImageRemoveOptions{Force: true, PruneChildren: true})
		if err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("cleanup: remove image %s: %v", ref, err)
		}
	})
}

// imageFiles reads paths out of image (a created, never started container): path -> tar entry + body. A path
// that does not exist is absent from the result.
func imageFiles(t *testing.T, image string, paths ...string) map[string]fileInImage {
	t.Helper()
	cli := testutil.Docker(t)
	ctx := t.Context()
	c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &container.Config{Image: image, Cmd: []string{"true"}},
		HostConfig: &container.HostConfig{NetworkMode: "none"},
	})
	if err != nil {
		t.Fatalf("create container from %s: %v", image, err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true}); err != nil {
			t.Errorf("remove container: %v", err)
		}
	}()
	out := map[string]fileInImage{}
	for _, p := range paths {
		res, err := cli.CopyFromContainer(ctx, c.ID, client.CopyFromContainerOptions{SourcePath: p})
		if cerrdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			t.Fatalf("copy %s from %s: %v", p, image, err)
		}
		raw, err := io.ReadAll(res.Content)
		res.Content.Close()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(bytes.NewReader(raw))
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("copy %s: %v", p, err)
		}
		body, _ := io.ReadAll(tr)
		out[p] = fileInImage{typ: h.Typeflag, linkname: h.Linkname, body: string(body), raw: raw}
	}
	return out
}

type fileInImage struct {
	typ      byte
	linkname string
	body     string
	raw      []byte // the whole archive the daemon sent
}

func TestBuild(t *testing.T) {
	base := testutil.TestImage(t)
	d, eng := newBuildDriver(t)
	root := buildRepo(t, map[string]string{
		".devcontainer/Dockerfile": "FROM " + base + "\n" +
			"COPY hello.txt /hello.txt\n" +
			"ARG GREETING\n" +
			"RUN echo $GREETING > /greeting\n" +
			"RUN ls /sys/class/net > /ifaces\n" +
			"COPY . /ctx/\n",
		"hello.txt":     "hello from the context\n",
		"ignored.txt":   "must not reach the image\n",
		".dockerignore": "ignored.txt\n",
	})
	if err := os.Symlink("/etc/passwd", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	req := build.Request{Root: root, Dockerfile: ".devcontainer/Dockerfile", Context: ".", Args: map[string]string{"GREETING": "hi there"}}

	var progress bytes.Buffer
	ref, id, err := d.Build(t.Context(), req, &progress)
	if ref != "" {
		removeImage(t, ref)
	}
	if err != nil {
		t.Fatalf("Build: %v\n%s", err, progress.String())
	}
	if !regexp.MustCompile(`^sandkeep-build-[0-9a-f]{24}:latest$`).MatchString(ref) || !strings.HasPrefix(id, "sha256:") {
		t.Fatalf("ref %q id %q", ref, id)
	}
	if n := eng.builds.Load(); n != 1 {
		t.Fatalf("%d ImageBuild calls, want 1", n)
	}
	if !regexp.MustCompile(`Step 1/\d+ : FROM ` + regexp.QuoteMeta(base)).MatchString(progress.String()) {
		t.Errorf("progress has no steps:\n%s", progress.String())
	}

	hostPasswd, err := os.ReadFile("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	files := imageFiles(t, id, "/hello.txt", "/greeting", "/ifaces", "/ctx/link", "/ctx/ignored.txt", "/ctx/hello.txt", "/ctx")
	if got := files["/hello.txt"].body; got != "hello from the context\n" {
		t.Errorf("/hello.txt = %q", got)
	}
	if got := files["/greeting"].body; got != "hi there\n" {
		t.Errorf("/greeting = %q", got)
	}
	if got := files["/ifaces"].body; got != "lo\n" {
		t.Errorf("RUN saw network interfaces %q, want only lo (network mode none)", got)
	}
	if l := files["/ctx/link"]; l.typ != tar.TypeSymlink || l.linkname != "/etc/passwd" {
		t.Errorf("/ctx/link = type %q target %q, want a symlink to /etc/passwd", l.typ, l.linkname)
	}
	if _, ok := files["/ctx/ignored.txt"]; ok {
		t.Error(".dockerignore'd file reached the image")
	}
	if _, ok := files["/ctx/hello.txt"]; !ok {
		t.Error("/ctx/hello.txt missing")
	}
	if len(hostPasswd) > 0 && bytes.Contains(files["/ctx"].raw, hostPasswd) {
		t.Error("the host's /etc/passwd content reached the image")
	}

	t.Run("same inputs are a cache hit", func(t *testing.T) {
		var progress bytes.Buffer
		ref2, id2, err := d.Build(t.Context(), req, &progress)
		if err != nil {
			t.Fatal(err)
		}
		if ref2 != ref || id2 != id {
			t.Errorf("second build: %s %s, want %s %s", ref2, id2, ref, id)
		}
		if n := eng.builds.Load(); n != 1 {
			t.Errorf("%d ImageBuild calls, want still 1", n)
		}
		if !strings.Contains(progress.String(), "already built") {
			t.Errorf("progress = %q", progress.String())
		}
	})
	t.Run("another arg is another image", func(t *testing.T) {
		req := req
		req.Args = map[string]string{"GREETING": "bonjour"}
		ref3, id3, err := d.Build(t.Context(), req, nil)
		if ref3 != "" {
			removeImage(t, ref3)
		}
		if err != nil {
			t.Fatal(err)
		}
		if ref3 == ref || id3 == id {
			t.Fatalf("same image for another arg: %s %s", ref3, id3)
		}
		if got := imageFiles(t, id3, "/greeting")["/greeting"].body; got != "bonjour\n" {
			t.Errorf("/greeting = %q", got)
		}
	})
	t.Run("a moved tag is rebuilt", func(t *testing.T) {
		cli := testutil.Docker(t)
		if _, err := cli.ImageTag(t.Context(), client.ImageTagOptions{Source: base, Target: ref}); err != nil {
			t.Fatal(err)
		}
		before := eng.builds.Load()
		ref4, id4, err := d.Build(t.Context(), req, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ref4 != ref || id4 != id || eng.builds.Load() != before+1 {
			t.Errorf("after a retag: %s %s, builds %d -> %d", ref4, id4, before, eng.builds.Load())
		}
	})
}

func TestBuildFailingRun(t *testing.T) {
	base := testutil.TestImage(t)
	d, _ := newBuildDriver(t)
	root := buildRepo(t, map[string]string{"Dockerfile": "FROM " + base + "\nRUN echo boom-marker; exit 3\n"})
	var progress bytes.Buffer
	ref, _, err := d.Build(t.Context(), build.Request{Root: root}, &progress)
	if ref != "" {
		removeImage(t, ref)
		t.Fatalf("a failed build returned %s", ref)
	}
	if !fault.Is(err, build.CodeFailed) || !strings.Contains(err.Error(), "returned a non-zero code: 3") {
		t.Fatalf("err = %v, want %s with the daemon's message", err, build.CodeFailed)
	}
	if !strings.Contains(progress.String(), "boom-marker") {
		t.Errorf("progress lacks the RUN's output:\n%s", progress.String())
	}
}

// TestBuildNoNetwork: RUN steps have no network (network mode none): only lo, and no route. Nothing is dialled
// to show it: the step reads its interfaces and routes and prints a marker only when there are none.
func TestBuildNoNetwork(t *testing.T) {
	base := testutil.TestImage(t)
	d, _ := newBuildDriver(t)
	step := `RUN ls /sys/class/net; [ "$(ls /sys/class/net)" = lo ] && [ "$(wc -l < /proc/net/route)" -le 1 ] && echo no-network-marker`
	root := buildRepo(t, map[string]string{"Dockerfile": "FROM " + base + "\n" + step + "\n"})
	var progress bytes.Buffer
	ref, _, err := d.Build(t.Context(), build.Request{Root: root}, &progress)
	if ref != "" {
		removeImage(t, ref)
	}
	if err != nil || !strings.Contains(progress.String(), "no-network-marker") {
		t.Fatalf("a RUN step saw a network (err %v):\n%s", err, progress.String())
	}
}

func TestBuildMissingBase(t *testing.T) {
	d, _ := newBuildDriver(t)
	root := buildRepo(t, map[string]string{"Dockerfile": "FROM localhost:1/sandkeep-missing:none\n"})
	_, _, err := d.Build(t.Context(), build.Request{Root: root}, nil)
	if !fault.Is(err, build.CodeFailed) {
		t.Fatalf("err = %v, want %s", err, build.CodeFailed)
	}
}

// TestBuildRefusedBeforeDocker: a request that leaves the repository never reaches the daemon.
func TestBuildRefusedBeforeDocker(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "Dockerfile"), []byte("FROM scratch\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  build.Request
	}{
		{"parent context", build.Request{Context: "../"}},
		{"absolute context", build.Request{Context: outside}},
		{"absolute dockerfile", build.Request{Dockerfile: filepath.Join(outside, "Dockerfile")}},
		{"parent dockerfile", build.Request{Dockerfile: "sub/../../Dockerfile"}},
		{"symlinked context", build.Request{Context: "out", Dockerfile: "Dockerfile"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, eng := newBuildDriver(t)
			root := buildRepo(t, map[string]string{"Dockerfile": "FROM scratch\n"})
			if err := os.Symlink(outside, filepath.Join(root, "out")); err != nil {
				t.Fatal(err)
			}
			req := tt.req
			req.Root = root
			_, _, err := d.Build(t.Context(), req, nil)
			if !fault.Is(err, build.CodeContextInvalid) {
				t.Fatalf("err = %v, want %s", err, build.CodeContextInvalid)
			}
			if eng.inspects.Load() != 0 || eng.builds.Load() != 0 {
				t.Fatalf("the daemon was called: %d inspects, %d builds", eng.inspects.Load(), eng.builds.Load())
			}
		})
	}
}

// TestBuildCancelled: ctx bounds the build; the error wraps ctx's cause.
func TestBuildCancelled(t *testing.T) {
	base := testutil.TestImage(t)
	d, _ := newBuildDriver(t)
	root := buildRepo(t, map[string]string{"Dockerfile": "FROM " + base + "\nRUN sleep 60\n"})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	start := time.Now()
	ref, _, err := d.Build(ctx, build.Request{Root: root}, nil)
	if ref != "" {
		removeImage(t, ref)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if time.Since(start) > 20*time.Second {
		t.Errorf("took %v", time.Since(start))
	}
}

// TestBuildDockerfileOutsideContext: a Dockerfile elsewhere in the repository is sent under the reserved name
// and never reaches the image, nor does the .dockerignore sandkeep wrote for it.
func TestBuildDockerfileOutsideContext(t *testing.T) {
	base := testutil.TestImage(t)
	d, _ := newBuildDriver(t)
	root := buildRepo(t, map[string]string{
		".devcontainer/Dockerfile": "FROM " + base + "\nCOPY . /ctx/\n",
		"app/main.txt":             "main\n",
	})
	ref, id, err := d.Build(t.Context(), build.Request{Root: root, Context: "app", Dockerfile: ".devcontainer/Dockerfile"}, nil)
	if ref != "" {
		removeImage(t, ref)
	}
	if err != nil {
		t.Fatal(err)
	}
	files := imageFiles(t, id, "/ctx/main.txt", "/ctx/"+build.ReservedDockerfile, "/ctx/.dockerignore", "/ctx/nonce.txt")
	if files["/ctx/main.txt"].body != "main\n" {
		t.Errorf("/ctx/main.txt = %q", files["/ctx/main.txt"].body)
	}
	for _, p := range []string{"/ctx/" + build.ReservedDockerfile, "/ctx/.dockerignore", "/ctx/nonce.txt"} {
		if _, ok := files[p]; ok {
			t.Errorf("%s reached the image", p)
		}
	}
}

// TestBuildRefusesNetworkSteps: a Dockerfile with ADD <url> (pointing at a recording server on loopback) or
// RUN --network is refused with BUILD_CONTEXT_INVALID before the daemon is called, and the server sees nothing.
func TestBuildRefusesNetworkSteps(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "fetched")
	}))
	defer srv.Close()
	base := testutil.TestImage(t)
	for _, df := range []string{
		"FROM " + base + "\nADD " + srv.URL + "/x /x\n",
		"FROM " + base + "\nARG U=" + srv.URL + "/x\nADD $U /x\n",
		"FROM " + base + "\nONBUILD ADD " + srv.URL + "/x /x\n",
		"FROM " + base + "\nRUN --network=host wget -O- " + srv.URL + "/x\n",
	} {
		d, eng := newBuildDriver(t)
		root := buildRepo(t, map[string]string{"Dockerfile": df})
		ref, _, err := d.Build(t.Context(), build.Request{Root: root}, nil)
		if ref != "" {
			removeImage(t, ref)
		}
		if !fault.Is(err, build.CodeContextInvalid) || !strings.Contains(err.Error(), "Dockerfile:") {
			t.Errorf("%q: err = %v, want %s naming the line", df, err, build.CodeContextInvalid)
		}
		if n := eng.builds.Load(); n != 0 {
			t.Errorf("%q: the daemon was asked to build %d times", df, n)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the recording server was hit %d times", n)
	}
}

// TestBuildBounded: a build's RUN steps run under the build's memory and CPU bounds (cgroup v1 here).
func TestBuildBounded(t *testing.T) {
	base := testutil.TestImage(t)
	d, _ := newBuildDriver(t)
	root := buildRepo(t, map[string]string{"Dockerfile": "FROM " + base + "\n" +
		"RUN echo mem=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max) " +
		"cpu=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cut -d' ' -f1 /sys/fs/cgroup/cpu.max)\n"})
	var progress bytes.Buffer
	ref, _, err := d.Build(t.Context(), build.Request{Root: root}, &progress)
	if ref != "" {
		removeImage(t, ref)
	}
	if err != nil {
		t.Fatalf("build: %v\n%s", err, progress.String())
	}
	if !strings.Contains(progress.String(), "mem=2147483648 cpu=100000") {
		t.Errorf("RUN's bounds:\n%s", progress.String())
	}
}

// TestBuildLimits: a RUN step gets the sandbox's nofile and core ulimits, a seccomp filter (mode 2, the
// engine's default profile: the engine takes no seccomp option for a build) and runs under the build's own
// pids-limited cgroup (issue 22, finding 3: builds had no pids limit and the engine's ulimits); the cgroup is
// gone once the build is.
func TestBuildLimits(t *testing.T) {
	base := testutil.TestImage(t)
	d, _ := newBuildDriver(t)
	if l := d.BuildLimits(t.Context()); l.Pids != 512 {
		t.Fatalf("BuildLimits = %+v, want a pids limit of 512 on this host (cgroupfs, root)", l)
	}
	root := buildRepo(t, map[string]string{"Dockerfile": "FROM " + base + "\n" +
		"RUN echo limits nofile=$(ulimit -n) core=$(ulimit -c) seccomp=$(grep '^Seccomp:' /proc/self/status | cut -f2) cgroup=$(grep pids /proc/self/cgroup | cut -d: -f3)\n"})
	var progress bytes.Buffer
	ref, _, err := d.Build(t.Context(), build.Request{Root: root}, &progress)
	if ref != "" {
		removeImage(t, ref)
	}
	if err != nil {
		t.Fatalf("build: %v\n%s", err, progress.String())
	}
	m := regexp.MustCompile(`limits nofile=8192 core=0 seccomp=2 cgroup=/sandkeep-build/([0-9a-f]+)/`).FindStringSubmatch(progress.String())
	if m == nil {
		t.Fatalf("RUN's limits:\n%s", progress.String())
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/pids/sandkeep-build", m[1])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the build's cgroup is still there after the build (stat: %v)", err)
	}
}

// TestBuildPidsLimited: a RUN step that starts 700 processes runs out of pids at the build's bound (512) and
// fails the build; without the bound all 700 started.
func TestBuildPidsLimited(t *testing.T) {
	base := testutil.TestImage(t)
	d, _ := newBuildDriver(t)
	root := buildRepo(t, map[string]string{"Dockerfile": "FROM " + base + "\n" +
		"RUN n=0; while [ $n -lt 700 ]; do sleep 30 & n=$((n+1)); done; echo spawned-$n\n"})
	var progress bytes.Buffer
	ref, _, err := d.Build(t.Context(), build.Request{Root: root}, &progress)
	if ref != "" {
		removeImage(t, ref)
	}
	if err == nil || strings.Contains(progress.String(), "spawned-700") {
		t.Fatalf("700 processes started in one RUN step (err %v):\n%s", err, progress.String())
	}
	if !strings.Contains(progress.String(), "can't fork") {
		t.Errorf("the build failed for another reason than fork: %v\n%s", err, progress.String())
	}
}
