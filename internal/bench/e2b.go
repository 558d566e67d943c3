package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/api"
	"github.com/sandkeep/sandkeep/internal/e2b"
)

// ScenarioE2B is opt-in (it needs node and the e2b SDK installed): `--scenario e2b`.
const ScenarioE2B = "e2b"

// Defaults of the e2b scenario.
const (
	DefaultE2BN       = 200           // warm commands.run('true') samples per series
	DefaultE2BCreateN = 10            // Sandbox.create() samples per series
	DefaultE2BSDK     = "test/e2b-ts" // the directory of the pinned SDK (npm ci) and bench.mjs
)

// E2B measures the E2B front from the e2b JavaScript SDK's side (test/e2b-ts/bench.mjs in a node process of its
// own, configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY) against `sandkeep serve`'s wiring on a
// loopback port (the API server with the E2B front, a Manager recording into an SQLite store). Rows:
//   - a warm `commands.run('true')` in one sandbox, timed by the SDK's caller, vs the same `true` exec'd in
//     that sandbox's container through the Engine API (what `docker exec` does), timed by its Go caller;
//   - the same SDK series vs `docker exec CONTAINER true`, the docker CLI as a whole process (when on PATH);
//   - `Sandbox.create()` to its first command's result vs `docker run --rm` of the same image.
//
// Series take turns in rotating blocks in one run (each side times its own calls; a block's timings come back
// at its end). The sandboxes the SDK creates are killed through it; Cleanup removes what an interruption left.
func E2B(ctx context.Context, e *Env, n, nCreate int, sdkDir string) (_ []Result, err error) {
	if sdkDir == "" {
		sdkDir = DefaultE2BSDK
	}
	script := filepath.Join(sdkDir, "bench.mjs")
	if _, err := exec.LookPath("node"); err != nil {
		return nil, fmt.Errorf("e2b: node is not on PATH (install nodejs): %w", err)
	}
	for _, f := range []string{script, filepath.Join(sdkDir, "node_modules", "e2b", "package.json")} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("e2b: %w (run `npm ci` in %s, or pass the directory of the SDK and bench.mjs)", err, sdkDir)
		}
	}
	dir, err := os.MkdirTemp("", "sandkeep-bench-e2b-")
	if err != nil {
		return nil, fmt.Errorf("e2b: %w", err)
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	front, err := e2b.New(e2b.Config{Dir: filepath.Join(dir, "records")})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, front.Close()) }()
	srv, err := startAPIServer(ctx, e, nil, "", func(c *api.Config) { c.E2B = front.Handler })
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, srv.close(ctx)) }()

	sdk, err := startSDK(ctx, script, "E2B_API_URL="+srv.url+"/e2b", "E2B_SANDBOX_URL="+srv.url+"/e2b/envd", "E2B_API_KEY="+srv.token)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, sdk.quit()) }()
	setup, err := sdk.call("setup")
	if err != nil {
		return nil, err
	}
	key, err := e.key("e2b-" + setup.Sandbox)
	if err != nil {
		return nil, err
	}
	container := key.ContainerName()
	if err := e.rawExec(ctx, container, nil, "true"); err != nil {
		return nil, fmt.Errorf("e2b: the sandbox's container %s: %w", container, err)
	}
	viaSDK := func(what string) func(context.Context, int) ([]time.Duration, error) {
		return func(_ context.Context, k int) ([]time.Duration, error) {
			r, err := sdk.call(what + " " + strconv.Itoa(k))
			if err != nil {
				return nil, err
			}
			if len(r.NS) != k {
				return nil, fmt.Errorf("e2b: %s %d answered %d timings", what, k, len(r.NS))
			}
			out := make([]time.Duration, k)
			for i, ns := range r.NS {
				out[i] = time.Duration(ns)
			}
			return out, nil
		}
	}
	series := []func(context.Context, int) ([]time.Duration, error){
		viaSDK("warm"),
		timed(func(ctx context.Context) error { return e.rawExec(ctx, container, nil, "true") }),
	}
	docker, _ := exec.LookPath("docker")
	if docker != "" {
		series = append(series, timed(func(ctx context.Context) error {
			out, err := exec.CommandContext(ctx, docker, "exec", container, "true").CombinedOutput()
			if err != nil {
				return fmt.Errorf("docker exec %s true: %w: %s", container, err, bytes.TrimSpace(out))
			}
			return nil
		}))
	}
	warm, err := blocks(ctx, n, series...)
	if err != nil {
		return nil, fmt.Errorf("e2b warm: %w", err)
	}
	extra := map[string]string{"client": "e2b npm SDK " + sdkVersion(sdkDir) + " (node)", "front": "envd process.Process on the engine's processes",
		"store": "sqlite"}
	rows := []Result{newResult("warm `commands.run('true')` through the e2b SDK", "Engine-API exec of `true` in the same container", warm[0], warm[1])}
	rows[0].Extra = extra
	if docker != "" {
		r := newResult("warm `commands.run('true')` through the e2b SDK", "`docker exec CONTAINER true` (the docker CLI)", warm[0], warm[2])
		r.Extra = extra
		rows = append(rows, r)
	}
	first, err := blocks(ctx, nCreate, viaSDK("create"), timed(e.rawRun))
	if err != nil {
		return nil, fmt.Errorf("e2b create: %w", err)
	}
	r := newResult("`Sandbox.create()` to the first `commands.run('true')` result (e2b SDK)", "`docker run --rm` of the same image", first[0], first[1])
	r.Extra = extra
	return append(rows, r), nil
}

// timed is a block of k samples of f, each timed by its caller.
func timed(f func(context.Context) error) func(context.Context, int) ([]time.Duration, error) {
	return func(ctx context.Context, k int) ([]time.Duration, error) {
		out := make([]time.Duration, 0, k)
		for range k {
			start := time.Now()
			if err := f(ctx); err != nil {
				return nil, err
			}
			out = append(out, time.Since(start))
		}
		return out, nil
	}
}

// blocks is rotate for series that time their own samples a block at a time: n samples of each, in blocks of
// rotateBlock (fewer for small n), the order rotating every round.
func blocks(ctx context.Context, n int, series ...func(context.Context, int) ([]time.Duration, error)) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(series))
	block := min(rotateBlock, max(1, n/4))
	for round := 0; round*block < n; round++ {
		k := min(block, n-round*block)
		for j := range series {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			s := (round + j) % len(series)
			d, err := series[s](ctx, k)
			if err != nil {
				return nil, err
			}
			out[s] = append(out[s], d...)
		}
	}
	return out, nil
}

func sdkVersion(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", "e2b", "package.json"))
	var p struct{ Version string }
	if err != nil || json.Unmarshal(b, &p) != nil {
		return "?"
	}
	return p.Version
}

// sdkProcess is bench.mjs in a node process: one command a line on its stdin, one JSON answer a line on stdout.
type sdkProcess struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *bytes.Buffer
	mu     sync.Mutex // one call at a time
}

type sdkAnswer struct {
	Sandbox string  `json:"sandbox"`
	NS      []int64 `json:"ns"`
	Error   string  `json:"error"`
}

func startSDK(ctx context.Context, script string, env ...string) (*sdkProcess, error) {
	cmd := exec.CommandContext(ctx, "node", filepath.Base(script))
	cmd.Dir, cmd.Env, cmd.WaitDelay = filepath.Dir(script), append(os.Environ(), env...), 10*time.Second
	p := &sdkProcess{cmd: cmd, stderr: &bytes.Buffer{}}
	cmd.Stderr = p.stderr
	var err error
	if p.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.out = bufio.NewScanner(stdout)
	p.out.Buffer(make([]byte, 0, 64<<10), 16<<20)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("e2b: start node: %w", err)
	}
	return p, nil
}

func (p *sdkProcess) call(line string) (sdkAnswer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := io.WriteString(p.in, line+"\n"); err != nil {
		return sdkAnswer{}, fmt.Errorf("e2b: %s: %w (%s)", line, err, strings.TrimSpace(p.stderr.String()))
	}
	if !p.out.Scan() {
		return sdkAnswer{}, fmt.Errorf("e2b: %s: no answer from node: %v (%s)", line, p.out.Err(), strings.TrimSpace(p.stderr.String()))
	}
	var a sdkAnswer
	if err := json.Unmarshal(p.out.Bytes(), &a); err != nil {
		return a, fmt.Errorf("e2b: %s: answer %q: %w", line, p.out.Text(), err)
	}
	if a.Error != "" {
		return a, fmt.Errorf("e2b: %s: %s", line, a.Error)
	}
	return a, nil
}

// quit kills the warm sandbox through the SDK and waits for node to exit.
func (p *sdkProcess) quit() error {
	_, err := p.call("quit")
	p.in.Close()
	return errors.Join(err, p.cmd.Wait())
}
