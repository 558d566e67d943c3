package sandkeep_test

import (
	"path/filepath"
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
	"github.com/sandkeep/sandkeep/internal/testutil"
	"github.com/sandkeep/sandkeep/stores"
)

// BenchmarkAdmit is what admission adds to every command that is admitted as a run of its own (Manager.Exec,
// the API's and MCP's exec): Admit and Finish, with the command itself left out since it is the same on an
// admitted run. "bare" is the policy pipeline alone (template, repository, mode, cached driver selection,
// decision, shape and network); "sqlite" adds the run row admission writes and finishes.
//
//	go test -run '^$' -bench BenchmarkAdmit -benchtime 2000x .
func BenchmarkAdmit(b *testing.B) {
	agent := testutil.AgentBinary(b)
	offer := []sandkeep.DriverOption{{Name: sandkeep.DriverDocker, New: func(sandkeep.DriverEnv) (sandkeep.Driver, error) {
		return fake.New(), nil // stands in for Docker: admission only pings it once
	}}}
	for _, tc := range []struct {
		name  string
		store bool
	}{{"bare", false}, {"sqlite", true}} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := sandkeep.Config{Home: b.TempDir(), Image: "img", AgentPath: agent, Drivers: offer, NoSweeper: true}
			if tc.store {
				st, err := stores.Open(b.Context(), filepath.Join(b.TempDir(), "runs.db"))
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				cfg.Store = st
			}
			m, err := sandkeep.Open(b.Context(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			key, _ := sandkeep.NewKey("acme", "bench")
			b.ReportAllocs()
			for b.Loop() {
				run, err := m.Admit(b.Context(), sandkeep.RunRequest{Key: key, Mode: "inline"})
				if err != nil || run.Driver != sandkeep.DriverDocker {
					b.Fatalf("admit: %+v, %v", run, err)
				}
				if err := run.Finish(nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
