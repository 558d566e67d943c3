package mcpserver

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// FuzzExecRequest decodes exec arguments as the SDK does and checks that what execRequest and then the engine's
// one validator (ExecRequest.Check) accept is within every limit, and that what they refuse carries a code.
func FuzzExecRequest(f *testing.F) {
	for _, s := range []string{
		`{"command":"echo hi"}`,
		`{"argv":["ls","-la"],"workdir":"src","timeout_seconds":5,"env":{"A":"1"},"stdin":"x"}`,
		`{"command":"ls","argv":["ls"]}`,
		`{"argv":[""]}`,
		`{"command":"ls","timeout_seconds":-3}`,
		`{"command":"ls","env":{"A=B":"1","":"2"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var in ExecInput
		if json.Unmarshal(data, &in) != nil {
			return
		}
		req, err := execRequest(in, 0)
		if err == nil {
			err = req.Check()
		}
		if err != nil {
			if fault.CodeOf(err) == "" {
				t.Fatalf("refusal without a code: %v", err)
			}
			return
		}
		if len(req.Argv) == 0 || req.Argv[0] == "" || len(req.Argv) > MaxArgs+2 {
			t.Fatalf("accepted argv %q", req.Argv)
		}
		if req.Timeout < time.Second || req.Timeout > MaxTimeout*time.Second {
			t.Fatalf("accepted timeout %v", req.Timeout)
		}
		total := 0
		for _, a := range req.Argv[:] {
			if strings.IndexByte(a, 0) >= 0 {
				t.Fatalf("accepted a NUL in argv %q", a)
			}
			total += len(a)
		}
		if len(req.Env) > MaxEnvVars {
			t.Fatalf("accepted %d env vars", len(req.Env))
		}
		for _, e := range req.Env {
			name, _, ok := strings.Cut(e, "=")
			if !ok || name == "" || strings.IndexByte(e, 0) >= 0 {
				t.Fatalf("accepted env entry %q", e)
			}
			total += len(e)
		}
		if total > MaxArgBytes+len("sh-c") {
			t.Fatalf("accepted %d bytes of argv and env", total)
		}
	})
}

// FuzzWriteInput checks write_file's decoders: content within the bound, modes within 0777 and never 0.
func FuzzWriteInput(f *testing.F) {
	f.Add("aGVsbG8=", "base64", "0644", int64(16))
	f.Add("hello", "utf-8", "755", int64(4))
	f.Add("!!", "base64", "0o7777", int64(1))
	f.Add("", "", "", int64(1))
	f.Fuzz(func(t *testing.T, content, encoding, mode string, limit int64) {
		if limit <= 0 {
			return
		}
		data, err := decodeContent(content, encoding, limit)
		if err == nil && int64(len(data)) > limit {
			t.Fatalf("accepted %d bytes over a limit of %d", len(data), limit)
		}
		if err != nil && fault.CodeOf(err) == "" {
			t.Fatalf("refusal without a code: %v", err)
		}
		m, err := parseMode(mode)
		if err == nil && (m == 0 || m > 0o777) {
			t.Fatalf("mode %q parsed to %o", mode, m)
		}
		if err != nil && fault.CodeOf(err) == "" {
			t.Fatalf("refusal without a code: %v", err)
		}
	})
}
