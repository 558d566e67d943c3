package lifecycle

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sandkeep/sandkeep/internal/driver/fake"
	"github.com/sandkeep/sandkeep/internal/events"
)

// payloadOf returns the payloads of the events named name among names/payloads.
func payloadsOf[T any](names []string, payloads []any, name string) []T {
	var out []T
	for i, n := range names {
		if n == name {
			out = append(out, payloads[i].(T))
		}
	}
	return out
}

// TestImageEnvPlanted: a sandbox made from an image that configures ENV runs its commands with those variables
// under its own, and the command that made it says which (names only) in sandbox_image_env_planted, with the
// names the sandbox's own environment replaced. A command that reuses the sandbox says nothing more.
func TestImageEnvPlanted(t *testing.T) {
	e := newEnv(t)
	e.drv = fake.New(fake.WithTempDir(t.TempDir()), fake.WithImage(testImage, testImageID),
		fake.WithImageEnv(testImageID, "GOPATH=/go", "HOME=/root", "GOPATH=/go2", "TOOL_SECRETLESS=x"))
	m := e.manager()
	k := key(t, "acme", "imgenv")
	var rec recorder
	req, out := sh(`echo "$GOPATH $TOOL_SECRETLESS"`)
	req.OnEvent = rec.sink
	if _, err := m.Exec(t.Context(), k, req); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.String()); got != "/go2 x" {
		t.Errorf("the command saw %q, want the image's GOPATH and TOOL_SECRETLESS", got)
	}
	names, payloads := rec.take()
	planted := payloadsOf[events.ImageEnvPlanted](names, payloads, events.NameImageEnvPlanted)
	if len(planted) != 1 {
		t.Fatalf("events %v: want one %s", names, events.NameImageEnvPlanted)
	}
	want := events.ImageEnvPlanted{Sandbox: k.ContainerName(), Image: testImage,
		Names: []string{"GOPATH", "HOME", "TOOL_SECRETLESS"}, Overridden: []string{"HOME"}}
	if p := planted[0]; p.Sandbox != want.Sandbox || p.Image != want.Image || !slices.Equal(p.Names, want.Names) || !slices.Equal(p.Overridden, want.Overridden) {
		t.Errorf("%s = %+v, want %+v", events.NameImageEnvPlanted, p, want)
	}
	if i := slices.Index(names, events.NameImageEnvPlanted); i > slices.Index(names, events.NameExecStarted) {
		t.Errorf("events %v: the image's environment is said before the command starts", names)
	}
	run(t, m, k, "true")
	req, _ = sh("true")
	req.OnEvent = rec.sink
	if _, err := m.Exec(t.Context(), k, req); err != nil {
		t.Fatal(err)
	}
	if names, _ := rec.take(); slices.Contains(names, events.NameImageEnvPlanted) {
		t.Errorf("a reusing command said %s again: %v", events.NameImageEnvPlanted, names)
	}
}

// TestWorkspaceHandoverEvent: when a key's sandbox uid changes (the operator set a uid range), the workspace is
// handed over to the new uid before the sandbox runs, and sandbox_user_remap says from which uid to which. Handing
// over needs root, as EnsureWorkspace's hand-over does.
func TestWorkspaceHandoverEvent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("handing a workspace over needs root")
	}
	e := newEnv(t)
	k := key(t, "acme", "handover")
	first := e.manager(func(c *Config) { c.User = "4242:4242"; c.UIDs = UIDsOff })
	run(t, first, k, "echo x > kept")
	first.Close()
	// The fake runs commands as this process's user; a sandbox's user 4242 would have written the file.
	if err := os.Lchown(e.home.Workspace(k)+"/kept", 4242, 4242); err != nil {
		t.Fatal(err)
	}

	var rec recorder
	second := e.manager(func(c *Config) { c.User = "4242:4242"; c.UIDs = UIDRange{First: 300000, Count: 16} })
	req, _ := sh("true")
	req.OnEvent = rec.sink
	if _, err := second.Exec(t.Context(), k, req); err != nil {
		t.Fatal(err)
	}
	names, payloads := rec.take()
	remaps := payloadsOf[events.UserRemap](names, payloads, events.NameUserRemap)
	if len(remaps) != 1 {
		t.Fatalf("events %v: want one %s", names, events.NameUserRemap)
	}
	r := remaps[0]
	if r.Origin != events.RemapWorkspace || r.FromUID == nil || *r.FromUID != 4242 || r.UID < 300000 || r.UID >= 300016 || r.GID != r.UID {
		t.Errorf("%s = %+v, want from 4242 to a uid of the range", events.NameUserRemap, r)
	}
	fi, err := os.Stat(e.home.Workspace(k) + "/kept")
	if err != nil {
		t.Fatal(err)
	}
	if owner := fileUID(fi); owner != r.UID {
		t.Errorf("the workspace's file is owned by %d after the handover, want %d", owner, r.UID)
	}
}

// TestUIDMismatchWarning: a sandkeep that does not run as root cannot hand a workspace owned by another uid over
// to the sandbox's; the sandbox runs anyway and sandbox_uid_mismatch_warning says whose the workspace is.
func TestUIDMismatchWarning(t *testing.T) {
	e := newEnv(t)
	k := key(t, "acme", "mismatch")
	owner := os.Geteuid()
	sandboxUID := 4343
	if owner == sandboxUID {
		sandboxUID++
	}
	geteuid = func() int { return 77777 } // neither root nor the sandbox's uid
	defer func() { geteuid = os.Geteuid }()
	m := e.manager(func(c *Config) { c.User = strconv.Itoa(sandboxUID) + ":" + strconv.Itoa(sandboxUID); c.UIDs = UIDsOff })
	var rec recorder
	req, _ := sh("true")
	req.OnEvent = rec.sink
	if _, err := m.Exec(t.Context(), k, req); err != nil {
		t.Fatalf("the sandbox runs anyway: %v", err)
	}
	names, payloads := rec.take()
	w := payloadsOf[events.UIDMismatch](names, payloads, events.NameUIDMismatch)
	if len(w) != 1 || w[0].OwnerUID != owner || w[0].UID != sandboxUID || w[0].Sandbox != k.ContainerName() {
		t.Fatalf("events %v, %s %+v: want one saying the workspace is %d's, not %d's", names, events.NameUIDMismatch, w, owner, sandboxUID)
	}
}

func fileUID(fi os.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}
