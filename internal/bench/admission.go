package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/stores"
)

// DefaultAdmissionN is how many samples each admission series takes.
const DefaultAdmissionN = 300

// Admission: what admission adds to a warm `true`, side by side in one loop: Manager.Exec (the command admitted
// as a run of its own: template, repository, mode, driver selection, decision) against Run.Exec on a run admitted
// once. Two rows: without a store, the policy pipeline alone; with an SQLite store, also the run row that
// admission writes and finishes (the record every entry point keeps).
func Admission(ctx context.Context, e *Env, n int) (_ []Result, err error) {
	row := func(name string, m *sandkeep.Manager, user string) (Result, error) {
		key, err := e.key(user)
		if err != nil {
			return Result{}, err
		}
		req := sandkeep.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute}
		if _, err := m.Exec(ctx, key, req); err != nil { // create the sandbox and connect its channel: not measured
			return Result{}, err
		}
		run, err := m.Admit(ctx, sandkeep.RunRequest{Key: key})
		if err != nil {
			return Result{}, err
		}
		defer run.Finish(nil)
		check := func(res *sandkeep.ExecResult, err error) error {
			switch {
			case err != nil:
				return err
			case res.ExitCode != 0 || res.Transport != transportAgent:
				return fmt.Errorf("admission bench: exit %d over %q", res.ExitCode, res.Transport)
			}
			return nil
		}
		s, err := rotate(ctx, n,
			func(ctx context.Context) error { return check(m.Exec(ctx, key, req)) },
			func(ctx context.Context) error { return check(run.Exec(ctx, req)) })
		if err != nil {
			return Result{}, fmt.Errorf("admission: %w", err)
		}
		r := newResult(name, "the same command on a run admitted once", s[0], s[1])
		r.Extra = map[string]string{"added_median_ms": fmt.Sprintf("%.3f", float64(r.Sandkeep.Median-r.Base.Median)/float64(time.Millisecond))}
		return r, nil
	}
	users := []string{"admit", "admit-store"}
	defer func() { err = errors.Join(err, e.removeUsers(ctx, users)) }()
	bare, err := row("warm exec, admitted per command (no store)", e.M, users[0])
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sandkeep-bench-admission-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	st, err := stores.Open(ctx, filepath.Join(dir, "sandkeep.db"))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	m, err := sandkeep.Open(ctx, e.withStore(st))
	if err != nil {
		return nil, err
	}
	defer m.Close()
	recorded, err := row("warm exec, admitted per command (SQLite run record)", m, users[1])
	if err != nil {
		return nil, err
	}
	return []Result{bare, recorded}, nil
}
