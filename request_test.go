package sandkeep_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
)

// TestExecRequestCheck is the one validator of a command, as every entry point meets it: each malformed request
// is refused with its code and the sentence a person sees; the edges of what is valid pass.
func TestExecRequestCheck(t *testing.T) {
	t.Parallel()
	argv := []string{"true"}
	for _, tt := range []struct {
		name string
		req  sandkeep.ExecRequest
		code sandkeep.Code // "" valid
		msg  string
	}{
		{"no argv", sandkeep.ExecRequest{}, "INVALID_ARGUMENT", "no command given"},
		{"empty program", sandkeep.ExecRequest{Argv: []string{"", "x"}}, "INVALID_ARGUMENT", "no command given"},
		{"timeout half a second", sandkeep.ExecRequest{Argv: argv, Timeout: 500 * time.Millisecond}, "INVALID_TIMEOUT", "timeout 500ms is out of range"},
		{"timeout 25h", sandkeep.ExecRequest{Argv: argv, Timeout: 25 * time.Hour}, "INVALID_TIMEOUT", "timeout 25h0m0s is out of range"},
		{"timeout negative", sandkeep.ExecRequest{Argv: argv, Timeout: -time.Second}, "INVALID_TIMEOUT", "timeout -1s is out of range"},
		{"output limit negative", sandkeep.ExecRequest{Argv: argv, OutputLimit: -1}, "INVALID_ARGUMENT", "output limit -1B is out of range"},
		{"output limit 65MiB", sandkeep.ExecRequest{Argv: argv, OutputLimit: 65 << 20}, "INVALID_ARGUMENT", "output limit 65MiB is out of range"},
		{"env without =", sandkeep.ExecRequest{Argv: argv, Env: []string{"TOKEN"}}, "INVALID_ENV", ""},
		{"env control char in name", sandkeep.ExecRequest{Argv: argv, Env: []string{"A\x01B=x"}}, "INVALID_ENV", ""},
		{"env NUL in value", sandkeep.ExecRequest{Argv: argv, Env: []string{"A=x\x00y"}}, "INVALID_ENV", ""},
		{"env one bad among good", sandkeep.ExecRequest{Argv: argv, Env: []string{"A=1", "B\x7f=2"}}, "INVALID_ENV", ""},
		{"workdir escape", sandkeep.ExecRequest{Argv: argv, Workdir: "../x"}, "INVALID_WORKDIR", ""},
		{"workdir proc", sandkeep.ExecRequest{Argv: argv, Workdir: "/proc/self/fd"}, "INVALID_WORKDIR", ""},
		{"terminal too wide", sandkeep.ExecRequest{Argv: argv, TTY: &sandkeep.TTY{Size: sandkeep.WindowSize{Rows: 24, Cols: 5000}}}, "INVALID_ARGUMENT", "terminal size 24x5000 is out of range"},
		{"defaults", sandkeep.ExecRequest{Argv: argv}, "", ""},
		{"timeout 1s", sandkeep.ExecRequest{Argv: argv, Timeout: time.Second}, "", ""},
		{"timeout 24h", sandkeep.ExecRequest{Argv: argv, Timeout: 24 * time.Hour}, "", ""},
		{"output limit 64MiB", sandkeep.ExecRequest{Argv: argv, OutputLimit: 64 << 20}, "", ""},
		{"terminal default size", sandkeep.ExecRequest{Argv: argv, TTY: &sandkeep.TTY{}}, "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.req.Check()
			if got := sandkeep.CodeOf(err); got != tt.code {
				t.Fatalf("Check() = %v, want code %q", err, tt.code)
			}
			var se *sandkeep.Error
			if tt.msg != "" && (!errors.As(err, &se) || se.Message != tt.msg || se.Hint == "") {
				t.Errorf("Check() = %v, want message %q and a hint", err, tt.msg)
			}
		})
	}
}
