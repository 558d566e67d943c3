package main

import (
	"os"
	"path/filepath"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/e2b"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// e2bFront opens serve's E2B front (docs/E2B.md): its records live in <home>/e2b.
func (g *globals) e2bFront(sc serverConfig) (*e2b.Front, error) {
	c, err := g.config()
	if err != nil {
		return nil, err
	}
	home := c.Home
	if home == "" {
		home = sandkeep.DefaultHome()
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, fault.Wrap(err, fault.InvalidArgument, "set SANDKEEP_HOME to a directory you can write", "state home %s", home)
	}
	return e2b.New(e2b.Config{Dir: filepath.Join(home, "e2b"), MaxTimeout: duration(sc.E2B.MaxTimeout, 0)})
}
