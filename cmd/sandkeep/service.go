package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/record"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
)

// openedService is what `sandkeep serve` and `sandkeep mcp` run on: a long-lived Manager that records every
// command into the store, the store itself (tokens, runs, events), and the service Backend over both.
type openedService struct {
	log     *slog.Logger // the Manager's logger (sandkeep's own log, on stderr)
	m       *sandkeep.Manager
	st      store.Store
	backend *service.Service
}

// openService opens the Manager (with the spec's sandbox block applied, when specPath is set, and mutate
// applied last) and the store.
func (g *globals) openService(ctx context.Context, specPath string, lim files.Limits, mutate func(*sandkeep.Config)) (*openedService, error) {
	c, err := g.config()
	if err != nil {
		return nil, err
	}
	if c.Store, err = g.storeDSN(); err != nil {
		return nil, err
	}
	if specPath != "" {
		sb, _, _, err := loadSpec(g.stderr, specPath)
		if err != nil {
			return nil, err
		}
		if sb.Build != nil {
			return nil, fault.New(fault.SpecUnsupported, "build the image ahead of time (sandkeep exec --spec builds it) and name it with image:",
				"a long-running server does not build images; the spec has build:")
		}
		if len(sb.SecretFiles) > 0 {
			return nil, fault.New(fault.SpecUnsupported, "use network credentials (injected by the egress proxy) for a service",
				"a long-running server does not deliver secret_files yet")
		}
		if err := apply(&c, sb); err != nil {
			return nil, err
		}
	}
	if mutate != nil {
		mutate(&c)
	}
	m, err := sandkeep.Open(ctx, c)
	if err != nil {
		return nil, err
	}
	st, err := record.Open(ctx, c.Store)
	if err != nil {
		m.Close()
		return nil, err
	}
	return &openedService{log: c.Logger, m: m, st: st, backend: service.New(m, st, lim)}, nil
}

func (s *openedService) Close() error {
	return errors.Join(s.m.Close(), s.st.Close())
}
