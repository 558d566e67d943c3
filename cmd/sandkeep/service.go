package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
)

// openedService is what `sandkeep serve` and `sandkeep mcp` run on: a long-lived Manager over the operator's
// Config that admits and records every command, the store itself (tokens, runs, events), and the service
// Backend over both.
type openedService struct {
	log     *slog.Logger // the Manager's logger (sandkeep's own log, on stderr)
	m       *sandkeep.Manager
	st      store.Store
	backend *service.Service
}

// admissionFlags are the operator's admission settings of serve and mcp, as exec has them: they apply to every
// run the service admits.
type admissionFlags struct {
	spec    string
	sandbox string
	driver  string
	trust   string
}

func (a *admissionFlags) bind(f *pflag.FlagSet) {
	f.StringVar(&a.spec, "spec", "", "the repository's sandkeep.yaml every run follows unless its template names one (default $SANDKEEP_SPEC)")
	f.StringVar(&a.sandbox, "sandbox", "", "sandbox mode of every run: none, auto or inline (default: the spec's, else $SANDKEEP_SANDBOX_DEFAULT, else auto)")
	f.StringVar(&a.driver, "driver", "", "use only this driver (docker, podman, host); unavailable is a refusal, never a fallback")
	f.StringVar(&a.trust, "trust", "trusted", "the trust callers get: trusted, or untrusted (a call may lower it, never raise it)")
}

// openService opens the Manager on the operator's Config (sc, flags, environment; mutate applied last) and the
// store. The engine is not required: a service starts while it is down and admits each run by its mode.
func (g *globals) openService(ctx context.Context, sc serverConfig, af admissionFlags, lim files.Limits, mutate func(*sandkeep.Config)) (*openedService, error) {
	c, err := g.operator(sc)
	if err != nil {
		return nil, err
	}
	if af.spec != "" {
		c.Spec = af.spec
	}
	if err := (service.Admission{Trust: af.trust}).Check(); err != nil {
		return nil, err
	}
	st, err := g.openStore(ctx)
	if err != nil {
		return nil, err
	}
	c.Store = st
	if mutate != nil {
		mutate(&c)
	}
	m, err := sandkeep.Open(ctx, c)
	if err != nil {
		st.Close()
		return nil, err
	}
	adm := service.Admission{Mode: af.sandbox, Driver: af.driver, Trust: af.trust}
	return &openedService{log: c.Logger, m: m, st: st, backend: service.New(m, st, lim, adm)}, nil
}

func (s *openedService) Close() error {
	return errors.Join(s.m.Close(), s.st.Close())
}
