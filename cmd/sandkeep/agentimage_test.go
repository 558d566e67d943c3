package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestAgentImage: `sandkeep agent image --out FILE` writes an OCI archive naming the tag, with the static agent
// as its only file; without --out, or with a dynamically linked agent, it refuses with a code and a hint.
func TestAgentImage(t *testing.T) {
	t.Parallel()
	agent := testutil.AgentBinary(t)
	out := filepath.Join(t.TempDir(), "agent.tar")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"agent", "image", "--agent", agent, "--out", out, "--tag", "registry.example/sandkeep-agent:v1"},
		strings.NewReader(""), &stdout, &stderr)
	if code != 0 || !strings.Contains(stdout.String(), "registry.example/sandkeep-agent:v1") {
		t.Fatalf("exit %d stdout %q stderr %q", code, &stdout, &stderr)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var index []byte
	layers := 0
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "index.json" {
			index, _ = io.ReadAll(tr)
		}
		if h.Size > 1<<20 { // the layer: the agent
			layers++
		}
	}
	var idx struct {
		Manifests []struct{ Annotations map[string]string }
	}
	if err := json.Unmarshal(index, &idx); err != nil || len(idx.Manifests) != 1 ||
		idx.Manifests[0].Annotations["io.containerd.image.name"] != "registry.example/sandkeep-agent:v1" || layers != 1 {
		t.Errorf("index %s (%v), %d big blobs; want one manifest named by the tag and one layer", index, err, layers)
	}

	for name, args := range map[string][]string{
		"no out":  {"agent", "image", "--agent", agent},
		"dynamic": {"agent", "image", "--agent", "/bin/ls", "--out", out + ".2"},
		"no tag":  {"agent", "image", "--agent", agent, "--out", out + ".3", "--tag", "sandkeep-agent"},
	} {
		stdout.Reset()
		stderr.Reset()
		if code := run(context.Background(), args, strings.NewReader(""), &stdout, &stderr); code != 125 || !strings.Contains(stderr.String(), "hint:") {
			t.Errorf("%s: exit %d stderr %q; want 125 with a hint", name, code, &stderr)
		}
	}
}
