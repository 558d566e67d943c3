package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/moby/client"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestRepositoryCannotReadTheHost: a repository's devcontainer.json that reaches for a host variable or a host
// file gets neither (unless the operator lists the variable): the sentinel never appears in the sandbox's
// environment, in its files, in docker inspect, in sandkeep's output or in the events. Each refusal names the tier,
// the field and the operator setting that would allow it.
func TestRepositoryCannotReadTheHost(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	const sentinelVar, sentinelFile = "sk-host-var-sentinel-71c2", "sk-host-file-sentinel-9a0e"
	hostDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(hostDir, "secret.txt"), []byte(sentinelFile), 0o644); err != nil {
		t.Fatal(err)
	}
	repo := t.TempDir()
	os.MkdirAll(filepath.Join(repo, ".devcontainer"), 0o755)
	write := func(dc string) {
		if err := os.WriteFile(filepath.Join(repo, ".devcontainer", "devcontainer.json"), []byte(dc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	spec := filepath.Join(repo, "sandkeep.yaml")
	os.WriteFile(spec, []byte("sandbox:\n  mode: inline\n"), 0o644)
	env := []string{"SK_SENTINEL_VAR=" + sentinelVar, "SK_LISTED=listed-value"}
	ten := c.ten("acme")

	write(`{"image": "` + testutil.TestImage(t) + `",
  "containerEnv": {"LEAK": "${localEnv:SK_SENTINEL_VAR}", "LISTED": "${localEnv:SK_LISTED}"}}`)
	probe := `echo "leak=[$LEAK] listed=[$LISTED]"; grep -rl sk-host- /workspace /tmp 2>/dev/null | head -1`
	r := c.runWith(t, nil, env, "exec", "--spec", spec, "--tenant", ten, "--user", "u", "--", "sh", "-c", probe).want(t, 0)
	if r.stdout != "leak=[] listed=[]\n" || !strings.Contains(r.stderr, "SK217") {
		t.Errorf("unlisted host variables: stdout %q, stderr %q (want both empty, SK217 warnings)", r.stdout, r.stderr)
	}
	// The operator lists one variable: that one, and only that one, is read.
	operator := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	os.WriteFile(operator, []byte("local_env: [SK_LISTED]\n"), 0o644)
	r = c.runWith(t, nil, append(env, "SANDKEEP_CONFIG="+operator), "exec", "--spec", spec, "--tenant", ten, "--user", "u", "--",
		"sh", "-c", probe).want(t, 0)
	if r.stdout != "leak=[] listed=[listed-value]\n" {
		t.Errorf("with local_env: [SK_LISTED]: %q", r.stdout)
	}

	// A bind of a host directory outside the repository is refused before anything is created.
	write(`{"image": "` + testutil.TestImage(t) + `", "mounts": ["source=` + hostDir + `,target=/stolen,type=bind"]}`)
	before := len(c.containers(t))
	r = c.runWith(t, nil, env, "exec", "--spec", spec, "--tenant", ten, "--user", "v", "--", "cat", "/stolen/secret.txt").
		wantFailure(t, "TIER_REFUSED")
	if !strings.Contains(r.stderr, "SK502") || !strings.Contains(r.stderr, "host_paths") || !strings.Contains(r.stderr, "tier repository") {
		t.Errorf("the refusal must name the code, the tier and the operator setting: %s", r.stderr)
	}
	if after := len(c.containers(t)); after != before {
		t.Errorf("a refused run created a container (%d -> %d)", before, after)
	}
	// A mode none from the repository is refused too, whatever --trust says.
	os.WriteFile(spec, []byte("sandbox:\n  mode: none\n"), 0o644)
	r = c.runWith(t, nil, env, "exec", "--spec", spec, "--trust", "trusted", "--tenant", ten, "--user", "u", "--", "true").
		wantFailure(t, "TIER_REFUSED")
	if !strings.Contains(r.stderr, "SK500") || !strings.Contains(r.stderr, "SANDKEEP_SANDBOX_DEFAULT") {
		t.Errorf("mode none from a repository: %s", r.stderr)
	}

	outputs := []string{r.stdout, r.stderr, c.run(t, "events", "--json").stdout, c.run(t, "runs", "--json").stdout}
	for _, id := range c.containers(t) {
		out, _ := testutil.Docker(t).ContainerInspect(t.Context(), id, client.ContainerInspectOptions{})
		outputs = append(outputs, strings.Join(out.Container.Config.Env, "\n"))
	}
	for _, out := range outputs {
		if strings.Contains(out, sentinelVar) || strings.Contains(out, sentinelFile) {
			t.Fatalf("a host sentinel reached sandkeep's output or the sandbox: %s", out)
		}
	}
}
