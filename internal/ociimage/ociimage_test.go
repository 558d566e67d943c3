package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"strings"
	"testing"
)

// TestWrite: the archive is a valid OCI layout whose blobs match their digests, whose index names the image,
// and whose layer holds the files (with parent directories) and Docker's manifest.json points at the same blobs.
func TestWrite(t *testing.T) {
	var buf bytes.Buffer
	res, err := Write(&buf, Image{
		Ref:        "docker.io/library/x:v1",
		Files:      []File{{Path: "/bin/tool", Mode: 0o555, Data: []byte("ELF")}, {Path: "/bin/sh", Mode: fs.ModeSymlink | 0o777, Link: "tool"}},
		Entrypoint: []string{"/bin/tool"},
	})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = b
	}
	for name, b := range files {
		if d, ok := strings.CutPrefix(name, "blobs/sha256/"); ok && d != "" {
			sum := sha256.Sum256(b)
			if hex.EncodeToString(sum[:]) != d {
				t.Errorf("blob %s has digest %x", name, sum)
			}
		}
	}
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, files["index.json"])
	}
	m := index.Manifests[0]
	if m.Digest != res.ManifestDigest || m.Annotations["io.containerd.image.name"] != "docker.io/library/x:v1" ||
		m.Annotations["org.opencontainers.image.ref.name"] != "v1" {
		t.Errorf("index manifest %+v, result %+v", m, res)
	}
	var manifest struct {
		Config struct{ Digest string }
		Layers []struct{ Digest string }
	}
	if err := json.Unmarshal(files[blobPath(res.ManifestDigest)], &manifest); err != nil || manifest.Config.Digest != res.ConfigDigest {
		t.Fatalf("manifest %s: %v", files[blobPath(res.ManifestDigest)], err)
	}
	layer := tar.NewReader(bytes.NewReader(files[blobPath(manifest.Layers[0].Digest)]))
	var names []string
	for {
		h, err := layer.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == "bin/tool" && h.Mode != 0o555 {
			t.Errorf("bin/tool mode %o", h.Mode)
		}
	}
	if strings.Join(names, " ") != "bin/ bin/sh bin/tool" {
		t.Errorf("layer entries %q", names)
	}
	var docker []struct {
		Config   string
		RepoTags []string
	}
	if err := json.Unmarshal(files["manifest.json"], &docker); err != nil || docker[0].Config != blobPath(res.ConfigDigest) || docker[0].RepoTags[0] != "docker.io/library/x:v1" {
		t.Errorf("manifest.json %s: %v", files["manifest.json"], err)
	}
	// The same input is the same image.
	var again bytes.Buffer
	res2, _ := Write(&again, Image{Ref: "docker.io/library/x:v1", Files: []File{{Path: "/bin/tool", Mode: 0o555, Data: []byte("ELF")}, {Path: "/bin/sh", Mode: fs.ModeSymlink | 0o777, Link: "tool"}}, Entrypoint: []string{"/bin/tool"}})
	if res2 != res {
		t.Errorf("not reproducible: %+v then %+v", res, res2)
	}
}

func TestWriteRefusals(t *testing.T) {
	for name, img := range map[string]Image{
		"no tag":       {Ref: "x"},
		"digest":       {Ref: "x@sha256:" + strings.Repeat("a", 64)},
		"relative":     {Ref: "x:1", Files: []File{{Path: "bin/../../x", Mode: 0o644}}},
		"duplicate":    {Ref: "x:1", Files: []File{{Path: "/a", Mode: 0o644}, {Path: "/a", Mode: 0o644}}},
		"file as dir":  {Ref: "x:1", Files: []File{{Path: "/a", Mode: 0o644}, {Path: "/a/b", Mode: 0o644}}},
		"special file": {Ref: "x:1", Files: []File{{Path: "/dev", Mode: fs.ModeDevice}}},
	} {
		if _, err := Write(io.Discard, img); err == nil {
			t.Errorf("%s: Write succeeded", name)
		}
	}
}
