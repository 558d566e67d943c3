package engine

import (
	"errors"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// capsDriver is a driver that only answers Name and Capabilities.
type capsDriver struct {
	driver.Driver
	name string
	caps driver.Capabilities
}

func (d capsDriver) Name() string                      { return d.name }
func (d capsDriver) Capabilities() driver.Capabilities { return d.caps }

// TestWorkspaceFolderNeedsBinds: a workspace folder other than /workspace on a driver that cannot bind host
// paths (kubernetes) is refused up front as SPEC_UNSUPPORTED, naming the folder and the driver, with a fix.
func TestWorkspaceFolderNeedsBinds(t *testing.T) {
	kube := capsDriver{name: "kubernetes", caps: driver.Capabilities{Persistent: true}}
	docker := capsDriver{name: "docker", caps: driver.Capabilities{HostBinds: true}}
	repo := &repository{sb: spec.Sandbox{WorkspaceFolder: "/workspaces/app"}}
	err := repo.fitsDriver(kube, false)
	var fe *fault.Error
	if !errors.As(err, &fe) || fe.Code != fault.SpecUnsupported || !strings.Contains(fe.Message, "/workspaces/app") ||
		!strings.Contains(fe.Message, "kubernetes") || !strings.Contains(fe.Hint, "--driver docker") {
		t.Fatalf("kube with a workspace folder: %v, want SPEC_UNSUPPORTED naming the folder and the driver, with a hint", err)
	}
	for _, tt := range []struct {
		name   string
		d      driver.Driver
		folder string
		onHost bool
	}{{"docker", docker, "/workspaces/app", false}, {"kube at /workspace", kube, "/workspace", false},
		{"kube without a folder", kube, "", false}, {"on the host", kube, "/workspaces/app", true}} {
		r := &repository{sb: spec.Sandbox{WorkspaceFolder: tt.folder}}
		if err := r.fitsDriver(tt.d, tt.onHost); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}
