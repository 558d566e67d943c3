package main

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/bench"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestBenchCommandLine runs `sandkeep bench` in-process on command lines it must refuse before it touches the
// engine or creates a home, so no engine is needed.
func TestBenchCommandLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		args   []string
		stderr string // regexp
		json   bool   // the failure comes as JSON on stdout
	}{
		{name: "unknown scenario", args: []string{"bench", "--scenario", "warm,nope"},
			stderr: `^sandkeep: INVALID_ARGUMENT: unknown scenario "nope" \(known: warm, output, first, concurrent, throughput, footprint, api, admission, tunnel, hardening, connect, pool, fleet, e2b\)\nhint: see 'sandkeep bench --help'\n$`},
		{name: "empty scenario", args: []string{"bench", "--scenario", " , "},
			stderr: `^sandkeep: INVALID_ARGUMENT: --scenario is empty\nhint: .*warm.*\n$`},
		{name: "requests zero", args: []string{"bench", "--requests", "0"},
			stderr: `^sandkeep: INVALID_ARGUMENT: .*requests.*\nhint: .*\n$`},
		{name: "n zero", args: []string{"bench", "--n", "0"},
			stderr: `^sandkeep: INVALID_ARGUMENT: --n 0 is out of range 1\.\.100000\nhint: .*\n$`},
		{name: "n not a number", args: []string{"bench", "--n", "many"},
			stderr: `^sandkeep: INVALID_ARGUMENT: invalid argument "many" for "--n" flag.*\nhint: see 'sandkeep bench --help'\n$`},
		{name: "keys negative", args: []string{"bench", "--keys", "-1"},
			stderr: `^sandkeep: INVALID_ARGUMENT: --keys -1 is out of range 1\.\.500\nhint: .*\n$`},
		{name: "footprint too many", args: []string{"bench", "--footprint", "5000"},
			stderr: `^sandkeep: INVALID_ARGUMENT: --footprint 5000 is out of range 1\.\.1000\nhint: .*\n$`},
		{name: "home refused", args: []string{"--home", "/tmp/x", "bench"},
			stderr: `^sandkeep: INVALID_ARGUMENT: --home does not apply to bench\nhint: .*temporary home.*\n$`},
		{name: "transport refused", args: []string{"bench", "--transport", "exec"},
			stderr: `^sandkeep: INVALID_ARGUMENT: --transport does not apply to bench\nhint: .*\n$`},
		{name: "arguments", args: []string{"bench", "warm"},
			stderr: `^sandkeep: INVALID_ARGUMENT: .*no arguments.*\nhint: see 'sandkeep bench --help'\n$`},
		{name: "json", args: []string{"bench", "--json", "--scenario", "nope"}, json: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), tt.args, strings.NewReader(""), &stdout, &stderr)
			if code != exitFailure {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, exitFailure, stdout.String(), stderr.String())
			}
			if tt.json {
				var got struct {
					Error struct{ Code, Message, Hint string } `json:"error"`
				}
				if err := json.Unmarshal(stdout.Bytes(), &got); err != nil || got.Error.Code != "INVALID_ARGUMENT" || got.Error.Hint == "" {
					t.Fatalf("want a JSON INVALID_ARGUMENT with a hint, got %q (%v)", stdout.String(), err)
				}
				return
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout should be empty, got %q", stdout.String())
			}
			if !regexp.MustCompile(tt.stderr).MatchString(stderr.String()) {
				t.Errorf("stderr %q does not match %q", stderr.String(), tt.stderr)
			}
		})
	}
}

// TestBench runs the built binary end to end on two scenarios with three samples and checks the JSON document's
// shape, that it used a home of its own, and that it left no container and no home behind. Timings are not
// checked.
func TestBench(t *testing.T) {
	c := newCLI(t)
	r := c.run(t, "bench", "--scenario", "warm,first", "--n", "3", "--json").want(t, 0)
	var top map[string]json.RawMessage
	if err := json.Unmarshal([]byte(r.stdout), &top); err != nil {
		t.Fatalf("stdout is not one JSON document: %v\n%s", err, r.stdout)
	}
	for _, k := range []string{"machine", "results", "installation", "tenant", "image"} {
		if _, ok := top[k]; !ok {
			t.Errorf("JSON document lacks %q:\n%s", k, r.stdout)
		}
	}
	var rep bench.Report
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("stdout is not the documented JSON document: %v\n%s", err, r.stdout)
	}
	if dec.More() {
		t.Fatalf("more than one JSON document on stdout:\n%s", r.stdout)
	}
	if rep.Installation == "" || rep.Tenant == "" {
		t.Fatalf("report does not name what it created: %s", r.stdout)
	}
	// Whatever the assertions below say, nothing of the run may outlive the test.
	testutil.Cleanup(t, rep.Installation)
	m := rep.Machine
	if m.Cores < 1 || m.MemoryBytes <= 0 || m.Kernel == "" || m.DockerVersion == "" || m.LoadStart == "" {
		t.Errorf("machine incomplete: %+v", m)
	}
	if rep.Image != testutil.TestImage(t) {
		t.Errorf("image %q, want the configured %q", rep.Image, testutil.TestImage(t))
	}
	if rep.Installation == c.installation {
		t.Errorf("bench used the user's state home %s", c.home)
	}
	wantRows := []struct{ scenario, transport string }{
		{"warm exec `true` (agent transport)", "agent"},
		{"warm exec `true` (exec transport)", "exec"},
		{"first command, new key", "agent"},
	}
	if len(rep.Results) != len(wantRows) || rep.Footprint != nil {
		t.Fatalf("got %d results (footprint %v), want %d:\n%s", len(rep.Results), rep.Footprint, len(wantRows), r.stdout)
	}
	for i, w := range wantRows {
		res := rep.Results[i]
		if res.Scenario != w.scenario || res.Baseline == "" || res.Extra["transport"] != w.transport {
			t.Errorf("result %d: %+v, want scenario %q over %s", i, res, w.scenario, w.transport)
		}
		if res.Sandkeep.N != 3 || res.Base.N != 3 || res.Sandkeep.Median <= 0 || res.Base.Median <= 0 || res.Ratio <= 0 ||
			res.Sandkeep.P99 < res.Sandkeep.Median || res.Base.P99 < res.Base.Median {
			t.Errorf("result %d has implausible statistics: %+v", i, res)
		}
	}
	for _, label := range []string{driver.LabelInstallation + "=" + rep.Installation, bench.LabelRaw + "=" + rep.Tenant} {
		if n := countLabelled(t, label); n != 0 {
			t.Errorf("%d containers labelled %s left behind", n, label)
		}
	}
	home := regexp.MustCompile(`temporary home (\S+)`).FindStringSubmatch(r.stderr)
	if home == nil {
		t.Fatalf("stderr does not name the temporary home:\n%s", r.stderr)
	}
	if _, err := os.Stat(home[1]); !os.IsNotExist(err) {
		t.Errorf("temporary home %s left behind (stat: %v)", home[1], err)
	}
	// The user's own home saw nothing.
	if ids := c.containers(t); len(ids) != 0 {
		t.Errorf("bench created sandboxes in the user's home: %v", ids)
	}
}

// countLabelled counts, straight from the engine, the containers carrying label.
func countLabelled(t *testing.T, label string) int {
	t.Helper()
	list, err := testutil.Docker(t).ContainerList(t.Context(), client.ContainerListOptions{
		All: true, Filters: client.Filters{}.Add("label", label),
	})
	if err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

// TestBenchHelpListsScenarios: `sandkeep bench --help` describes every scenario --scenario accepts, so a new
// one cannot land without a line saying what it measures.
func TestBenchHelpListsScenarios(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"bench", "--help"}, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, name := range append(slices.Clone(bench.Scenarios), scenarioCLI) {
		if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(name) + ` +\S`).MatchString(stdout.String()) {
			t.Errorf("bench --help has no line for scenario %q:\n%s", name, stdout.String())
		}
	}
}
