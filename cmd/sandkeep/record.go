package main

import (
	"context"
	"os"
	"path/filepath"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/stores"
)

// openStore opens the store named by --store or $SANDKEEP_STORE: a postgres:// URL, or an SQLite file; by
// default <home>/sandkeep.db.
func (g *globals) openStore(ctx context.Context) (store.Store, error) {
	if g.daemon != nil {
		st, err := g.daemon.store(ctx)
		if err != nil {
			return nil, err
		}
		return sharedStore{st}, nil
	}
	dsn, err := g.storeDSN()
	if err != nil {
		return nil, err
	}
	return stores.Open(ctx, dsn)
}

// storeDSN is the store openStore opens.
func (g *globals) storeDSN() (string, error) {
	dsn := g.store
	if dsn == "" {
		dsn = os.Getenv("SANDKEEP_STORE")
	}
	if dsn != "" {
		return dsn, nil
	}
	c, err := g.config()
	if err != nil {
		return "", err
	}
	home := c.Home
	if home == "" {
		home = sandkeep.DefaultHome()
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		return "", fault.Wrap(err, fault.StoreUnavailable, "set SANDKEEP_HOME to a directory you can write", "state home %s", home)
	}
	return filepath.Join(home, "sandkeep.db"), nil
}

// manager opens this process's Manager on the operator tier's Config (flags, environment, $SANDKEEP_CONFIG)
// with the run store, mutate applied last. closeAll closes both.
func (g *globals) manager(ctx context.Context, mutate func(*sandkeep.Config)) (m *sandkeep.Manager, closeAll func(), err error) {
	if g.daemon != nil {
		var c sandkeep.Config
		if mutate != nil {
			mutate(&c) // exec's --gate-wait
		}
		m, err := g.daemon.manager(ctx, managerKey{withStore: true, gateWait: c.GateWait})
		return m, func() {}, err
	}
	sc, err := loadServerConfig(os.Getenv(envConfig))
	if err != nil {
		return nil, nil, err
	}
	c, err := g.operator(sc)
	if err != nil {
		return nil, nil, err
	}
	st, err := g.openStore(ctx)
	if err != nil {
		return nil, nil, err
	}
	c.Store = st
	if mutate != nil {
		mutate(&c)
	}
	if m, err = sandkeep.Open(ctx, c); err != nil {
		st.Close()
		return nil, nil, err
	}
	return m, func() { m.Close(); st.Close() }, nil
}

// operator is the operator tier's Config: the CLI's flags over the environment (ConfigFromEnv), the offered
// drivers, and what the operator's config file sc says (network presets, the repository policy, templates).
func (g *globals) operator(sc serverConfig) (sandkeep.Config, error) {
	c, err := g.config()
	if err != nil {
		return c, err
	}
	if c.Drivers, err = offeredDrivers(); err != nil {
		return c, err
	}
	c.NetworkPresets, c.NetworkSilent, c.NetworkRefused = sc.Network.Presets, sc.Network.Silent, sc.Network.Refused
	c.Repository = sc.Operator
	c.Templates, err = sc.templates()
	c.DefaultTemplate, c.TenantTemplates, c.PoolCap = sc.DefaultTemplate, sc.TenantTemplates, sc.PoolCap
	c.HostState, c.HostStatePaths = sc.HostState, sc.HostStatePaths
	if len(sc.HostServices) > 0 {
		c.HostServices = map[string]string{}
		for name, s := range sc.HostServices {
			c.HostServices[name] = s.URL
		}
	}
	c.SnapshotQuota = sandkeep.SnapshotQuota{Count: sc.SnapshotQuota.Count, Bytes: sc.SnapshotQuota.Bytes}
	c.SnapshotStore = sandkeep.SnapshotStore(sc.SnapshotStore)
	return c, err
}

// sharedStore is the daemon's store as one call sees it: closing it is the daemon's business.
type sharedStore struct{ store.Store }

func (sharedStore) Close() error { return nil }
