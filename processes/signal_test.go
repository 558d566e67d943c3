package processes_test

import (
	"syscall"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/processes"
)

func TestParseSignal(t *testing.T) {
	tests := []struct {
		in   string
		want syscall.Signal
		ok   bool
	}{
		{"TERM", syscall.SIGTERM, true}, {"sigkill", syscall.SIGKILL, true}, {"SIGINT", syscall.SIGINT, true},
		{" hup ", syscall.SIGHUP, true}, {"9", syscall.SIGKILL, true}, {"64", syscall.Signal(64), true},
		{"0", 0, false}, {"65", 0, false}, {"-1", 0, false}, {"", 0, false}, {"SIG", 0, false}, {"TERMX", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := processes.ParseSignal(tt.in)
			if tt.ok && (err != nil || got != tt.want) {
				t.Fatalf("ParseSignal(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
			if !tt.ok && !fault.Is(err, fault.InvalidArgument) {
				t.Fatalf("ParseSignal(%q) = %v, %v; want INVALID_ARGUMENT", tt.in, got, err)
			}
		})
	}
}

func FuzzParseSignal(f *testing.F) {
	for _, s := range []string{"TERM", "sigkill", "9", "64", "65", "", "SIGSIG"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sig, err := processes.ParseSignal(s)
		if err == nil && (sig < 1 || sig > 64) {
			t.Fatalf("ParseSignal(%q) = %d, out of 1..64", s, sig)
		}
		if err != nil && !fault.Is(err, fault.InvalidArgument) {
			t.Fatalf("ParseSignal(%q): %v", s, err)
		}
	})
}
