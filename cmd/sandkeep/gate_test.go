package main

import (
	"sync"
	"testing"
)

// TestGateAcrossProcesses: sandkeep processes that share a home serialize one key's commands and create its
// sandbox once; different keys do not wait for each other.
func TestGateAcrossProcesses(t *testing.T) {
	t.Parallel()

	t.Run("same key serializes and converges", func(t *testing.T) {
		t.Parallel()
		c := newCLI(t)
		// Each command fails with 9 if another one of the same key is inside its critical section.
		const n = 8
		results := make([]result, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				results[i], errs[i] = c.exec(t.Context(), nil, nil, "exec", "--tenant", c.ten("acme"), "--user", "crowd", "--",
					"sh", "-c", "mkdir /workspace/lock || exit 9; sleep 0.3; rmdir /workspace/lock")
			})
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("process %d: %v", i, errs[i])
			}
			results[i].want(t, 0)
		}
		if ids := c.containers(t); len(ids) != 1 {
			t.Errorf("%d processes made %d containers for one key, want 1: %v", n, len(ids), ids)
		}
		if rows := c.ps(t); len(rows) != 1 {
			t.Errorf("ps: %+v", rows)
		}
	})

	t.Run("different keys overlap", func(t *testing.T) {
		t.Parallel()
		c := newCLI(t)
		a := c.startBlocker(t, c.ten("acme"), "holder")
		// While a's command holds its key (a cannot end before its release), another key's first command
		// creates its sandbox and completes.
		r := c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "other", "--", "echo", "done").want(t, 0)
		if r.stdout != "done\n" {
			t.Errorf("stdout %q", r.stdout)
		}
		a.wantRunning(t)
		a.finish(t)
	})

	t.Run("busy key", func(t *testing.T) {
		t.Parallel()
		c := newCLI(t)
		a := c.startBlocker(t, c.ten("acme"), "busy")
		c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "busy", "--gate-wait", "1s", "--", "true").
			wantFailure(t, "SANDBOX_BUSY")
		c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "busy", "--gate-wait", "1s", "--json", "--", "true").
			wantJSONError(t, "SANDBOX_BUSY")
		c.runWith(t, nil, []string{"SANDKEEP_GATE_WAIT=1s"}, "exec", "--tenant", c.ten("acme"), "--user", "busy", "--", "true").
			wantFailure(t, "SANDBOX_BUSY")
		a.wantRunning(t)
		a.finish(t)
		// Once the holder is done, the key is free again.
		c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "busy", "--gate-wait", "1m", "--", "true").want(t, 0)
	})
}
