package lifecycle

import (
	"path/filepath"

	"github.com/sandkeep/sandkeep/internal/driver"
)

// BuildPosture returns the posture a Manager with cfg gives a sandbox whose workspace, agent directory and
// channel directory ("" for none) are these: the same function New uses, for drivers' conformance tests and
// for doctor.
func BuildPosture(cfg Config, workspace, agentDir, chanDir string) (driver.Posture, error) {
	cfg.setDefaults()
	uid, gid, err := cfg.validate()
	if err != nil {
		return driver.Posture{}, err
	}
	return cfg.posture(workspace, filepath.Join(filepath.Dir(workspace), "volumes"), agentDir, chanDir, uid, gid), nil
}
