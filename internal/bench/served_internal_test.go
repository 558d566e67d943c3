package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/drivers"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// BenchmarkServedExec is one served warm `true` per op: the Go SDK over keep-alive TCP to an API server whose
// Manager records every run, its events and its run log in its store, as `sandkeep serve` does (the api
// scenario's served row, without the other series). It is the loop to profile the served path with:
//
//	SANDKEEP_REQUIRE_DOCKER=1 go test -run '^$' -bench ServedExec -benchtime 1000x \
//	  -cpuprofile cpu.out -blockprofile block.out -mutexprofile mutex.out ./internal/bench/
//
// SANDKEEP_BENCH_POSTGRES=DSN records into PostgreSQL instead of a fresh SQLite file.
func BenchmarkServedExec(b *testing.B) {
	cli := testutil.Docker(b)
	image := testutil.TestImage(b)
	home, agent := b.TempDir(), testutil.AgentBinary(b)
	cfg := sandkeep.Config{Home: home, Image: image, AgentPath: agent, Transport: transportAgent,
		Drivers: []sandkeep.DriverOption{drivers.Docker()}, NoSweeper: true}
	m, err := sandkeep.Open(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	testutil.Cleanup(b, m.Installation())
	var r [4]byte
	_, _ = rand.Read(r[:])
	e := &Env{M: m, Docker: cli, Image: image, Tenant: "bench-" + hex.EncodeToString(r[:]), Config: cfg}
	ctx := context.WithoutCancel(b.Context())
	defer func() {
		if err := Cleanup(ctx, cli, m.Installation(), e.Tenant); err != nil {
			b.Error(err)
		}
	}()
	srv, err := startAPIServer(ctx, e, nil, os.Getenv("SANDKEEP_BENCH_POSTGRES"))
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := srv.close(ctx); err != nil {
			b.Error(err)
		}
	}()
	c, tr, err := srv.client()
	if err != nil {
		b.Fatal(err)
	}
	defer tr.CloseIdleConnections()
	for range 10 { // the sandbox made, its channel connected, the connection dialled
		if _, err := apiTrue(ctx, c, e.Tenant, "served", ""); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if _, err := apiTrue(ctx, c, e.Tenant, "served", ""); err != nil {
			b.Fatal(err)
		}
	}
}
