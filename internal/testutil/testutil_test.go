package testutil_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"os/exec"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

func TestTestImageRuns(t *testing.T) {
	cli := testutil.Docker(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	ref := testutil.TestImage(t)
	first, err := cli.ImageInspect(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if again := testutil.TestImage(t); again != ref {
		t.Fatalf("TestImage = %q, then %q", ref, again)
	}
	second, err := cli.ImageInspect(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if first.ID != second.ID {
		t.Fatalf("image ID changed between calls: %s -> %s", first.ID, second.ID)
	}

	installation := "testutil-" + randomHex(t)
	testutil.Cleanup(t, installation)
	created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image:  first.ID,
			Cmd:    []string{"/bin/echo", "ok"},
			User:   "sandbox",
			Labels: map[string]string{driver.LabelInstallation: installation},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	wait := cli.ContainerWait(ctx, created.ID, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case res := <-wait.Result:
		if res.StatusCode != 0 {
			t.Fatalf("exit status %d", res.StatusCode)
		}
	case err := <-wait.Error:
		t.Fatal(err)
	}
	logs, err := cli.ContainerLogs(ctx, created.ID, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	var stdout, stderr bytes.Buffer
	if _, err := stdcopy.StdCopy(&stdout, &stderr, logs); err != nil {
		t.Fatal(err)
	}
	if stdout.String() != "ok\n" || stderr.Len() != 0 {
		t.Fatalf("stdout %q, stderr %q; want %q and nothing", stdout.String(), stderr.String(), "ok\n")
	}
}

func TestImageVariant(t *testing.T) {
	cli := testutil.Docker(t)
	base, err := cli.ImageInspect(t.Context(), testutil.TestImage(t))
	if err != nil {
		t.Fatal(err)
	}
	tag := "sandkeep-test-variant-" + randomHex(t) + ":latest"
	id := testutil.ImageVariant(t, tag, "v1")
	if id == base.ID {
		t.Fatalf("variant has the base image's ID %s", id)
	}
	img, err := cli.ImageInspect(t.Context(), tag)
	if err != nil {
		t.Fatal(err)
	}
	if img.ID != id || img.Config.Labels[testutil.LabelVariant] != "v1" {
		t.Fatalf("variant %s: ID %s (want %s), labels %v", tag, img.ID, id, img.Config.Labels)
	}
}

func randomHex(t testing.TB) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func TestBuildBinary(t *testing.T) {
	path := testutil.BuildBinary(t, "./internal/testutil/testdata/hello", "hello", false)
	if again := testutil.BuildBinary(t, "./internal/testutil/testdata/hello", "hello", false); again != path {
		t.Fatalf("second build at %s, first at %s", again, path)
	}
	out, err := exec.Command(path).Output()
	if err != nil || string(out) != "hello\n" {
		t.Fatalf("%s: %q, %v", path, out, err)
	}
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s built with CGO_ENABLED=0 has a program interpreter", path)
		}
	}
}
