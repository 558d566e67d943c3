package doctor

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunVerdictsNeedsAndTimeouts(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	checks := []Check{
		{Name: "a", Run: func(context.Context) Result { return Result{Status: Pass, Detail: "fine"} }},
		{Name: "b", Needs: []string{"a"}, Run: func(context.Context) Result { return Result{Status: Warn, Detail: "meh", Fix: "do x"} }},
		{Name: "slow", Run: func(ctx context.Context) Result { <-ctx.Done(); <-release; return Result{Status: Pass} }},
		{Name: "c", Needs: []string{"slow"}, Run: func(context.Context) Result { return Result{Status: Pass} }},
		{Name: "d", Needs: []string{"b"}, Run: func(context.Context) Result { return Result{Status: Fail, Fix: "do y"} }},
	}
	got := Run(t.Context(), checks, 50*time.Millisecond)
	want := []Status{Pass, Warn, Fail, Skip, Fail}
	for i, r := range got {
		if r.Status != want[i] || r.Name != checks[i].Name {
			t.Errorf("check %d = %s %s, want %s %s", i, r.Name, r.Status, checks[i].Name, want[i])
		}
	}
	if got[2].Fix == "" || !strings.Contains(got[2].Detail, "50ms") {
		t.Errorf("timed-out check: %+v", got[2])
	}
	if ExitCode(got) != 1 || ExitCode(got[:2]) != 0 {
		t.Error("exit codes")
	}
	var b bytes.Buffer
	if err := Print(&b, got); err != nil || !strings.Contains(b.String(), "fix: do y") || strings.Contains(b.String(), "fix: do x\n") && !strings.Contains(b.String(), "WARN") {
		t.Errorf("print:\n%s", b.String())
	}
}
