package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sandkeep/sandkeep/internal/testutil"
)

// registryProbe listens on 127.0.0.1 as a registry would and counts the connections made to it (each closed at
// once: nothing is ever served). It returns its host:port and the count.
func registryProbe(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			conn.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String(), &n
}

// TestRepoImageRegistries: a repository-named image the engine does not have (sandkeep.yaml's image:,
// devcontainer.json's image, a compose companion's, a Dockerfile's FROM and COPY --from) is refused before any
// pull, as TIER_REFUSED with SK514 naming image_registries, unless the operator lists its registry there; a
// refused one is never asked of its registry (a loopback listener of the test's counts no connection), an
// allowed one is (the engine tries to pull it: it is not a registry, so IMAGE_UNAVAILABLE, not repeating what
// the engine said of it). An image the engine has runs from any registry name. Issue 22, finding 6: the engine
// pulled a repository's absent image from any registry.
func TestRepoImageRegistries(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.env = append(c.env, "SANDKEEP_DAEMON=off")
	host, dials := registryProbe(t)
	absent := host + "/sandkeep-test/absent:1"
	repo := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(repo, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	specImage := write("image.yaml", "sandbox:\n  image: "+absent+"\n")
	specBuild := write("build.yaml", "sandbox:\n  build:\n    dockerfile: from/Dockerfile\n    context: from\n")
	write("from/Dockerfile", "FROM "+absent+"\nRUN true\n")
	specCopy := write("copy.yaml", "sandbox:\n  build:\n    dockerfile: copy/Dockerfile\n    context: copy\n")
	write("copy/Dockerfile", "FROM "+testutil.TestImage(t)+"\nCOPY --from="+absent+" /x /x\n")
	write("dc/.devcontainer/devcontainer.json", `{"image": "`+absent+`"}`)
	specDC := write("dc/sandkeep.yaml", "sandbox:\n  mode: inline\n")
	write("compose/.devcontainer/devcontainer.json", `{"dockerComposeFile": ["compose.yml"], "service": "app", "runServices": ["db"]}`)
	write("compose/.devcontainer/compose.yml", "services:\n  app:\n    image: "+testutil.TestImage(t)+"\n  db:\n    image: "+absent+"\n")
	specCompose := write("compose/sandkeep.yaml", "sandbox:\n  mode: inline\n")

	for _, tc := range []struct{ name, spec, field string }{
		{"spec image", specImage, "image"},
		{"devcontainer image", specDC, "image"},
		{"compose companion image", specCompose, "services.db.image"},
		{"build FROM", specBuild, "build FROM"},
		{"build COPY --from", specCopy, "build FROM"},
	} {
		r := c.run(t, "exec", "--spec", tc.spec, "--tenant", c.ten("acme"), "--user", "img", "--", "true").wantFailure(t, "TIER_REFUSED")
		for _, s := range []string{"SK514", absent, "image_registries: [" + host + "]", "field " + tc.field} {
			if !strings.Contains(r.stderr, s) {
				t.Errorf("%s: the refusal does not say %q:\n%s", tc.name, s, r.stderr)
			}
		}
	}
	if n := dials.Load(); n != 0 {
		t.Fatalf("the registry of a refused image was dialled %d times: something pulled it", n)
	}

	// An image the engine has is used whatever its registry (the test image's is docker.io, not listed).
	present := write("present.yaml", "sandbox:\n  image: "+testutil.TestImage(t)+"\n")
	c.run(t, "exec", "--spec", present, "--tenant", c.ten("acme"), "--user", "present", "--", "true").want(t, 0)

	// The operator lists the registry: the engine is asked to pull it, and does try.
	operator := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	if err := os.WriteFile(operator, []byte("image_registries: [\""+host+"\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.env = append(c.env, "SANDKEEP_CONFIG="+operator)
	r := c.run(t, "exec", "--spec", specImage, "--tenant", c.ten("acme"), "--user", "img", "--", "true").wantFailure(t, "IMAGE_UNAVAILABLE")
	if dials.Load() == 0 {
		t.Error("an allowlisted registry was never dialled: the image was not pulled")
	}
	// What the engine said of the registry (its URL, the connection's fate) is not repeated.
	for _, s := range []string{"/v2/", "daemon", "connection", "EOF"} {
		if strings.Contains(r.stderr, s) {
			t.Errorf("the pull's failure repeats what the engine said of the registry (%q):\n%s", s, r.stderr)
		}
	}
}
