package lifecycle

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
	"github.com/sandkeep/sandkeep/internal/fault"
)

func TestRemove(t *testing.T) {
	tests := []struct {
		name          string
		create        bool // the key has a sandbox
		keepWorkspace bool
		wantCode      fault.Code
	}{
		{"sandbox and workspace", true, false, ""},
		{"sandbox, keep workspace", true, true, ""},
		{"no sandbox, keep workspace", false, true, fault.NotFound},
		{"no sandbox, drop workspace", false, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			m := e.manager()
			k, bystander := key(t, "acme", "alice"), key(t, "acme", "bob")
			run(t, m, bystander, `echo mine > note.txt`)
			ws := e.home.Workspace(k)
			if tt.create {
				run(t, m, k, `echo data > note.txt`)
			} else if err := os.MkdirAll(ws, 0o700); err != nil { // a workspace left by an earlier removal
				t.Fatal(err)
			}

			err := m.Remove(t.Context(), k, tt.keepWorkspace)
			if got := fault.CodeOf(err); got != tt.wantCode || (tt.wantCode == "" && err != nil) {
				t.Fatalf("Remove = %v; want code %q", err, tt.wantCode)
			}
			e.absent(k)
			if exists(ws) != (tt.keepWorkspace) {
				t.Errorf("workspace exists = %v after Remove(keepWorkspace=%v)", exists(ws), tt.keepWorkspace)
			}
			if tt.create && tt.keepWorkspace && !exists(filepath.Join(ws, "note.txt")) {
				t.Errorf("kept workspace lost its file")
			}
			if tt.create && !e.home.LastUsed(k).IsZero() {
				t.Errorf("last-used record kept after Remove")
			}
			// The bystander is untouched.
			if sb := e.inspect(bystander); sb.State != driver.StateRunning {
				t.Errorf("bystander is %s", sb.State)
			}
			if !exists(filepath.Join(e.home.Workspace(bystander), "note.txt")) {
				t.Errorf("bystander's workspace was touched")
			}
			if tt.create {
				res, out := run(t, m, k, `cat note.txt 2>/dev/null || echo none`)
				want := "none\n"
				if tt.keepWorkspace {
					want = "data\n"
				}
				if out != want || res.Sandbox.State != driver.StateRunning {
					t.Errorf("exec after Remove read %q, want %q", out, want)
				}
			}
		})
	}
}

func TestStop(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	k := key(t, "acme", "alice")
	if err := m.Stop(t.Context(), k); !fault.Is(err, fault.NotFound) {
		t.Errorf("Stop without a sandbox = %v; want SANDBOX_NOT_FOUND", err)
	}
	first, _ := run(t, m, k, `true`)
	if err := m.Stop(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	if st := e.inspect(k).State; st != driver.StateStopped {
		t.Errorf("after Stop the sandbox is %s", st)
	}
	if err := m.Stop(t.Context(), k); err != nil {
		t.Errorf("second Stop = %v; want nil (idempotent)", err)
	}
	execs := e.drv.Calls(fake.OpExec)
	again, _ := run(t, m, k, `true`)
	if again.Sandbox.ID != first.Sandbox.ID {
		t.Errorf("exec after Stop ran in %s, want %s started again", again.Sandbox.ID, first.Sandbox.ID)
	}
	if n := e.drv.Calls(fake.OpExec) - execs; n != 1 {
		t.Errorf("exec after Stop took %d driver execs, want 1 (Stop must forget the cached sandbox)", n)
	}
}

func TestListSortsAndSkipsStrangers(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	keys := [][2]string{{"globex", "zed"}, {"acme", "bob"}, {"acme", "alice"}}
	for _, kk := range keys {
		run(t, m, key(t, kk[0], kk[1]), `true`)
	}
	// Ours by installation label, but not a valid sandbox of ours: left out.
	if _, err := e.drv.ExternalCreate(&driver.CreateSpec{
		Name: "sandkeep-u-forged", ImageID: testImageID,
		Labels: map[string]string{driver.LabelInstallation: e.home.Installation, driver.LabelTenant: "acme", driver.LabelUser: "eve"},
	}); err != nil {
		t.Fatal(err)
	}
	infos, err := m.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var got [][2]string
	for _, in := range infos {
		got = append(got, [2]string{in.Key.Tenant, in.Key.User})
		if in.Name != in.Key.ContainerName() || in.State != driver.StateRunning {
			t.Errorf("info %+v", in)
		}
	}
	want := [][2]string{{"acme", "alice"}, {"acme", "bob"}, {"globex", "zed"}}
	if len(got) != len(want) {
		t.Fatalf("List = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("List = %v, want %v", got, want)
			break
		}
	}
}
