package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
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

	// A stop behind a running command says on stderr what it waits for, then stops once the command is over.
	t.Run("stop says what it waits for", func(t *testing.T) {
		t.Parallel()
		c := newCLI(t)
		tenant := c.ten("acme")
		a := c.startBlocker(t, tenant, "waited")
		ctx, cancel := context.WithTimeout(t.Context(), processBound)
		defer cancel()
		stop := c.command(ctx, nil, "stop", "--tenant", tenant, "--user", "waited")
		var stdout bytes.Buffer
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer pr.Close()
		stop.Stdout, stop.Stderr = &stdout, pw
		err = stop.Start()
		pw.Close()
		if err != nil {
			t.Fatal(err)
		}
		_ = pr.SetReadDeadline(time.Now().Add(processBound)) // a stop that never says it waits fails, not hangs
		stderr := bufio.NewReader(pr)
		line, err := stderr.ReadString('\n')
		name := keyOf(t, tenant, "waited").ContainerName()
		want := "sandkeep: stopping " + name + ": waiting for the command or file operation it runs to finish (at most "
		if !strings.HasPrefix(line, want) || !strings.HasSuffix(line, ", then SANDBOX_BUSY; Ctrl-C gives up)\n") {
			t.Errorf("stop's first stderr line %q (%v), want %q...", line, err, want)
		}
		a.wantRunning(t) // the stop is still waiting: the command holds the sandbox
		a.finish(t)
		werr := stop.Wait()
		_ = pr.SetReadDeadline(time.Now().Add(10 * time.Second))
		rest, _ := io.ReadAll(stderr)
		if err := werr; err != nil || stdout.String() != name+"\n" || len(rest) != 0 {
			t.Fatalf("stop after the command ended: %v, stdout %q, more stderr %q", err, stdout.String(), rest)
		}
		if rows := c.ps(t); len(rows) != 1 || rows[0].State != "stopped" {
			t.Errorf("ps after the stop: %+v", rows)
		}
	})
}
