package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestLogsRun: `sandkeep logs --run ID` shows what a run's setup did: a failed image build's engine output (the
// RUN step's own line and the daemon's error) and a post-create's output, with the driver's actions, each line
// labelled with its source; --json gives the entries; an unknown run is NOT_FOUND, a missing --run refused.
func TestLogsRun(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	ten := c.ten("acme")
	repo := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(repo, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("Dockerfile", "FROM "+testutil.TestImage(t)+"\nRUN echo build-output-marker-"+c.suffix+" && exit 3\n")
	broken := write("broken.yaml", "sandbox:\n  mode: inline\n  build: {dockerfile: Dockerfile}\n")
	c.run(t, "exec", "--spec", broken, "--tenant", ten, "--user", "b", "--", "true").wantFailure(t, "BUILD_FAILED")
	run, _ := c.lastRun(t)
	out := c.run(t, "logs", "--run", run.ID).want(t, 0).stdout
	for _, want := range []string{"[build]", "build-output-marker-" + c.suffix, "build failed:"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs of the failed build lack %q:\n%s", want, out)
		}
	}

	post := write("post.yaml", "sandbox:\n  mode: inline\n  post_create: echo post-create-marker-"+c.suffix+"\n")
	c.run(t, "exec", "--spec", post, "--tenant", ten, "--user", "p", "--", "true").want(t, 0)
	run, _ = c.lastRun(t)
	out = c.run(t, "logs", "--run", run.ID, "--follow").want(t, 0).stdout // the run is over: --follow ends
	for _, want := range []string{"[driver]", "create sandbox", "[post_create] post-create-marker-" + c.suffix, "post_create in sandbox", "exited 0"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs of the post-create run lack %q:\n%s", want, out)
		}
	}
	var entry struct{ RunID, Source, Text string }
	first, _, _ := strings.Cut(c.run(t, "logs", "--run", run.ID, "--json").want(t, 0).stdout, "\n")
	if err := json.Unmarshal([]byte(first), &entry); err != nil || entry.Source != "driver" {
		t.Errorf("--json first entry %q: %+v, %v", first, entry, err)
	}
	c.run(t, "logs", "--run", "0190c4f0-0000-7000-8000-000000000000").wantFailure(t, "RUN_NOT_FOUND")
	c.run(t, "logs").wantFailure(t, "INVALID_ARGUMENT")
	t.Logf("sandkeep logs --run %s:\n%s", run.ID, out)
}
