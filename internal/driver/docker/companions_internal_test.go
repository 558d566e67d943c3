package docker

import (
	"testing"

	"github.com/sandkeep/sandkeep/internal/driver"
)

// TestCompanionUlimits: a compose companion gets the sandbox's core and nofile limits (issue 22, Low 12: it got
// none, so a companion could dump core onto the host's disk and open files without bound).
func TestCompanionUlimits(t *testing.T) {
	p := driver.Posture{PidsLimit: 64, Ulimits: []driver.Ulimit{{Name: "core", Soft: 0, Hard: 0}, {Name: "nofile", Soft: 1024, Hard: 1024}}}
	_, host := companionConfig(&driver.Sandbox{Name: "sandkeep-u-x"}, p, driver.Companion{Service: "db", Image: "db:1"}, "none")
	got := map[string][2]int64{}
	for _, u := range host.Resources.Ulimits {
		got[u.Name] = [2]int64{u.Soft, u.Hard}
	}
	if got["core"] != [2]int64{0, 0} || got["nofile"] != [2]int64{1024, 1024} || len(got) != 2 {
		t.Errorf("companion ulimits %v, want core 0/0 and nofile 1024/1024", got)
	}
}
