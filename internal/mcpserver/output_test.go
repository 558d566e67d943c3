package mcpserver

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep"
)

// printNUL makes the fake backend behave as the library does for a command printing n NUL bytes: into
// req.Stdout when the caller gives a writer, else collected into the result.
func printNUL(n int) func(context.Context, sandkeep.Key, sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
	chunk := make([]byte, 64<<10)
	return func(_ context.Context, _ sandkeep.Key, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
		if req.Stdout == nil {
			return &sandkeep.ExecResult{Stdout: string(make([]byte, n))}, nil
		}
		for left := n; left > 0; left -= len(chunk) {
			if _, err := req.Stdout.Write(chunk[:min(left, len(chunk))]); err != nil {
				return nil, err
			}
		}
		_, _ = io.WriteString(req.Stderr, "warning\n")
		return &sandkeep.ExecResult{}, nil
	}
}

// TestExecResultHeap: an exec whose command prints 16 MiB of NUL bytes (96 MiB as JSON, twice in a tool result:
// structured and as text) is answered with the server allocating far less than the output: the result keeps
// ResultLimit bytes with a marker, and the whole output is in a workspace file the result names.
func TestExecResultHeap(t *testing.T) {
	const size = 16 << 20
	b, cs, key := setup(t, Options{OutputLimit: size})
	// measure returns what one call printing n NUL bytes allocated (server and in-process client together).
	measure := func(n int) (uint64, ExecOutput) {
		b.execFn = printNUL(n)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		res := call(t, cs, ToolExec, map[string]any{"command": "head -c N /dev/zero"})
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc, output[ExecOutput](t, res)
	}
	small, _ := measure(1 << 20)
	alloc, out := measure(size)
	// The bar of the HTTP answer (under 3x the output, which the library's collected result alone would be),
	// and not growing with the output: 16 times the output costs about what 1 MiB did.
	if alloc > 3*size || alloc > 2*small+4<<20 {
		t.Errorf("answering 16 MiB of output allocated %d MiB (1 MiB: %d MiB), want under %d MiB and about the same",
			alloc>>20, small>>20, 3*size>>20)
	} else {
		t.Logf("answering 16 MiB of output allocated %.1f MiB, 1 MiB of output %.1f MiB", float64(alloc)/(1<<20), float64(small)/(1<<20))
	}
	if !out.StdoutTruncated || out.StdoutFile == "" || !strings.HasPrefix(out.StdoutFile, "/workspace/"+OutputDir+"/") {
		t.Fatalf("result %+v", ExecOutput{StdoutTruncated: out.StdoutTruncated, StdoutFile: out.StdoutFile})
	}
	marker := "[sandkeep: output cut at 65536 of 16777216 bytes; all of it is in " + out.StdoutFile + "]"
	if !strings.HasSuffix(out.Stdout, marker) || len(out.Stdout) != DefaultResultLimit+1+len(marker) {
		t.Errorf("stdout is %d bytes ending %q", len(out.Stdout), out.Stdout[max(0, len(out.Stdout)-200):])
	}
	if out.Stderr != "warning\n" || out.StderrFile != "" || out.StderrTruncated {
		t.Errorf("stderr %q file %q truncated %v", out.Stderr, out.StderrFile, out.StderrTruncated)
	}
	data, err := os.ReadFile(filepath.Join(b.wsDir(key), strings.TrimPrefix(out.StdoutFile, "/workspace/")))
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != size || bytes.IndexFunc(data, func(r rune) bool { return r != 0 }) >= 0 {
		t.Errorf("the output file holds %d bytes, want %d NUL bytes", len(data), size)
	}
}

// A short output stays whole in the result and writes no file; a backend that collected the output itself
// (output in the result, not in the writers) is held to the same bound.
func TestExecResultLimit(t *testing.T) {
	b, cs, key := setup(t, Options{ResultLimit: 1000})
	b.execFn = func(context.Context, sandkeep.Key, sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
		return &sandkeep.ExecResult{Stdout: "short\n", Stderr: strings.Repeat("e", 1500)}, nil
	}
	out := output[ExecOutput](t, call(t, cs, ToolExec, map[string]any{"command": "x"}))
	if out.Stdout != "short\n" || out.StdoutFile != "" || out.StdoutTruncated {
		t.Errorf("stdout %q file %q truncated %v", out.Stdout, out.StdoutFile, out.StdoutTruncated)
	}
	if !out.StderrTruncated || out.StderrFile == "" || !strings.HasPrefix(out.Stderr, strings.Repeat("e", 1000)+"\n[sandkeep: output cut at 1000 of 1500 bytes") {
		t.Errorf("stderr %q file %q", out.Stderr, out.StderrFile)
	}
	data, err := os.ReadFile(filepath.Join(b.wsDir(key), strings.TrimPrefix(out.StderrFile, "/workspace/")))
	if err != nil || string(data) != strings.Repeat("e", 1500) {
		t.Errorf("the stderr file: %d bytes, %v", len(data), err)
	}
	if entries, _ := os.ReadDir(filepath.Join(b.wsDir(key), OutputDir)); len(entries) != 1 {
		t.Errorf("%d output files, want 1 (stderr only)", len(entries))
	}
}
