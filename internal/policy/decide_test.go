package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
)

var (
	docker     = Selection{Driver: "docker", Sandboxing: true}
	hostSel    = Selection{Driver: "host"}
	nothing    = Selection{}
	noSandbox  = &NoSandboxError{Kind: KindLocal, Tried: []ProbeFailure{{Driver: "docker", Err: errDown}}}
	explicitH  = &NoSandboxError{Explicit: true}
	hardDocker = fault.Wrap(errDown, fault.SandboxDriverUnavailable, "start it", "driver docker, named with --driver, is unavailable")
)

func res(mode string, src Source) Resolution { return Resolution{Mode: mode, Source: src} }

func TestDecide(t *testing.T) {
	tests := []struct {
		name        string
		in          DecideInputs
		want        Action
		wantDriver  string
		wantCode    fault.Code
		wantDisp    Disposition
		wantEvent   *events.SandboxSkipped // Obstacle compared by prefix only when set
		wantLoud    bool
		wantDropped bool
		wantInMsg   string
	}{
		{name: "none trusted: host, silent", in: DecideInputs{Mode: res("none", SourceCLI), Trust: Trusted},
			want: RunOnHost, wantDriver: "host"},
		{name: "none ignores the selection", in: DecideInputs{Mode: res("none", SourceSpec), Trust: Trusted, Selected: docker},
			want: RunOnHost, wantDriver: "host"},
		{name: "none ignores even a hard obstacle", in: DecideInputs{Mode: res("none", SourceEnv), Trust: Trusted, Obstacle: hardDocker},
			want: RunOnHost, wantDriver: "host"},
		{name: "none with secret files: refused, never dropped silently", in: DecideInputs{Mode: res("none", SourceCLI), Trust: Trusted, SpecHasSecretFiles: true},
			want: Refuse, wantCode: fault.SecretsNeedSandbox, wantDisp: Deterministic, wantInMsg: "secret files"},
		{name: "none untrusted: refused naming the tier", in: DecideInputs{Mode: res("none", SourceEnv), Trust: Untrusted},
			want: Refuse, wantCode: fault.UntrustedWithoutSandbox, wantDisp: Deterministic,
			wantInMsg: EnvSandboxDefault},
		{name: "zero trust is untrusted", in: DecideInputs{Mode: res("none", SourceCLI)},
			want: Refuse, wantCode: fault.UntrustedWithoutSandbox, wantDisp: Deterministic,
			wantInMsg: "--sandbox"},
		{name: "auto with docker", in: DecideInputs{Mode: res("auto", SourceDefault), Trust: Trusted, Selected: docker},
			want: RunSandboxed, wantDriver: "docker"},
		{name: "auto untrusted with docker", in: DecideInputs{Mode: res("auto", SourceDefault), Trust: Untrusted, Selected: docker, SpecHasSecretFiles: true},
			want: RunSandboxed, wantDriver: "docker"},
		{name: "inline with docker", in: DecideInputs{Mode: res("inline", SourceSpec), Trust: Untrusted, Selected: docker},
			want: RunSandboxed, wantDriver: "docker"},
		{name: "auto degrades: host, event, loud line", in: DecideInputs{Mode: res("auto", SourceDefault), Trust: Trusted, Selected: hostSel, Obstacle: noSandbox},
			want: RunOnHost, wantDriver: "host", wantLoud: true,
			wantEvent: &events.SandboxSkipped{Mode: "auto", Source: string(SourceDefault), Obstacle: "no sandboxing driver"}},
		{name: "auto degrades with secret files dropped", in: DecideInputs{Mode: res("auto", SourceSpec), Trust: Trusted, Selected: hostSel, Obstacle: noSandbox, SpecHasSecretFiles: true},
			want: RunOnHost, wantDriver: "host", wantLoud: true, wantDropped: true,
			wantEvent: &events.SandboxSkipped{Mode: "auto", Source: string(SourceSpec), Obstacle: "no sandboxing driver", FileSecretsDropped: true}},
		{name: "auto with --driver host degrades loudly", in: DecideInputs{Mode: res("auto", SourceCLI), Trust: Trusted, Selected: hostSel, Obstacle: explicitH},
			want: RunOnHost, wantDriver: "host", wantLoud: true,
			wantEvent: &events.SandboxSkipped{Mode: "auto", Source: string(SourceCLI), Obstacle: "--driver host"}},
		{name: "auto untrusted without a sandbox: refused naming the tier", in: DecideInputs{Mode: res("auto", SourceDefault), Trust: Untrusted, Selected: hostSel, Obstacle: noSandbox},
			want: Refuse, wantCode: fault.UntrustedWithoutSandbox, wantDisp: Deterministic,
			wantEvent: &events.SandboxSkipped{Mode: "auto", Source: string(SourceDefault), Refused: true}, wantInMsg: "the built-in default"},
		{name: "auto without even the host", in: DecideInputs{Mode: res("auto", SourceEnv), Trust: Trusted, Selected: nothing, Obstacle: noSandbox},
			want: Refuse, wantCode: fault.SandboxDriverUnavailable, wantDisp: Deterministic,
			wantEvent: &events.SandboxSkipped{Mode: "auto", Source: string(SourceEnv), Refused: true}},
		{name: "inline without a sandbox: refused", in: DecideInputs{Mode: res("inline", SourceSpec), Trust: Trusted, Selected: hostSel, Obstacle: noSandbox, SpecHasSecretFiles: true},
			want: Refuse, wantCode: fault.SandboxDriverUnavailable, wantDisp: Deterministic,
			wantEvent: &events.SandboxSkipped{Mode: "inline", Source: string(SourceSpec), Refused: true}, wantInMsg: "daemon down"},
		{name: "inline with --driver host: refused", in: DecideInputs{Mode: res("inline", SourceCLI), Trust: Trusted, Selected: hostSel, Obstacle: explicitH},
			want: Refuse, wantCode: fault.SandboxDriverUnavailable, wantDisp: Deterministic,
			wantEvent: &events.SandboxSkipped{Mode: "inline", Source: string(SourceCLI), Refused: true}},
		{name: "inline untrusted without a sandbox: driver unavailable", in: DecideInputs{Mode: res("inline", SourceCLI), Trust: Untrusted, Selected: nothing, Obstacle: noSandbox},
			want: Refuse, wantCode: fault.SandboxDriverUnavailable, wantDisp: Deterministic,
			wantEvent: &events.SandboxSkipped{Mode: "inline", Source: string(SourceCLI), Refused: true}},
		{name: "auto with an explicit driver down: hard, no degrade", in: DecideInputs{Mode: res("auto", SourceCLI), Trust: Trusted, Obstacle: hardDocker},
			want: Refuse, wantCode: fault.SandboxDriverUnavailable, wantDisp: Deterministic,
			wantEvent: &events.SandboxSkipped{Mode: "auto", Source: string(SourceCLI), Refused: true}, wantInMsg: "--driver"},
		{name: "an obstacle without a code", in: DecideInputs{Mode: res("auto", SourceCLI), Trust: Trusted, Obstacle: errors.New("odd")},
			want: Refuse, wantCode: fault.SandboxDriverUnavailable, wantDisp: Deterministic,
			wantEvent: &events.SandboxSkipped{Mode: "auto", Source: string(SourceCLI), Refused: true}},
		{name: "a cancelled selection", in: DecideInputs{Mode: res("auto", SourceCLI), Trust: Trusted, Obstacle: fmt.Errorf("select: %w", context.Canceled)},
			want: Refuse, wantCode: fault.SandboxDriverUnavailable, wantDisp: Infrastructure,
			wantEvent: &events.SandboxSkipped{Mode: "auto", Source: string(SourceCLI), Refused: true}},
		{name: "unresolved mode", in: DecideInputs{Mode: res("", SourceCLI), Trust: Trusted, Selected: docker},
			want: Refuse, wantCode: fault.Internal, wantDisp: Deterministic},
		{name: "garbage mode", in: DecideInputs{Mode: res("Auto", SourceCLI), Trust: Trusted, Selected: docker},
			want: Refuse, wantCode: fault.Internal, wantDisp: Deterministic},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.in)
			if d.Action != tc.want || d.Driver != tc.wantDriver {
				t.Fatalf("Decide = %s on %q (%v); want %s on %q", d.Action, d.Driver, d.Err, tc.want, tc.wantDriver)
			}
			if got := fault.CodeOf(d.Err); got != tc.wantCode || d.FailureCode != tc.wantCode {
				t.Errorf("code %q (FailureCode %q), want %q", got, d.FailureCode, tc.wantCode)
			}
			if d.Disposition != tc.wantDisp {
				t.Errorf("disposition %q, want %q", d.Disposition, tc.wantDisp)
			}
			wantStatus := RunStatus("")
			if tc.want == Refuse {
				wantStatus = StatusFailed
				var fe *fault.Error
				if !errors.As(d.Err, &fe) || fe.Hint == "" {
					t.Errorf("refusal %v is not a *fault.Error with a hint", d.Err)
				}
			} else if d.Err != nil {
				t.Errorf("Err = %v on %s", d.Err, d.Action)
			}
			if d.Status != wantStatus {
				t.Errorf("status %q, want %q", d.Status, wantStatus)
			}
			if tc.wantInMsg != "" && !strings.Contains(d.Err.Error(), tc.wantInMsg) {
				t.Errorf("message %q does not name %q", d.Err, tc.wantInMsg)
			}
			checkEvent(t, d.Event, tc.wantEvent)
			if loud := d.CLILine != ""; loud != tc.wantLoud {
				t.Errorf("CLILine %q, want loud %v", d.CLILine, tc.wantLoud)
			}
			if strings.ContainsAny(d.CLILine, "\n\r") {
				t.Errorf("CLILine has a line break: %q", d.CLILine)
			}
			if d.FileSecretsDropped != tc.wantDropped {
				t.Errorf("FileSecretsDropped %v, want %v", d.FileSecretsDropped, tc.wantDropped)
			}
			if tc.wantDropped && tc.wantLoud && !strings.Contains(d.CLILine, "secret files") {
				t.Errorf("CLILine %q does not say secret files are dropped", d.CLILine)
			}
		})
	}
}

func checkEvent(t *testing.T, got, want *events.SandboxSkipped) {
	t.Helper()
	if (got == nil) != (want == nil) {
		t.Fatalf("event %+v, want %+v", got, want)
	}
	if got == nil {
		return
	}
	if got.Mode != want.Mode || got.Source != want.Source || got.Refused != want.Refused || got.FileSecretsDropped != want.FileSecretsDropped {
		t.Errorf("event %+v, want %+v", got, want)
	}
	if got.Obstacle == "" || !strings.Contains(got.Obstacle, want.Obstacle) {
		t.Errorf("event obstacle %q, want one containing %q", got.Obstacle, want.Obstacle)
	}
}

// TestDecideIgnoresSource: the source only labels. Every combination of mode, trust, selection, obstacle and
// secret files gets the same action, driver, code, status and disposition whatever tier chose the mode.
func TestDecideIgnoresSource(t *testing.T) {
	sels := []Selection{docker, hostSel, nothing}
	obstacles := []error{nil, noSandbox, explicitH, hardDocker}
	for _, mode := range []string{"none", "auto", "inline"} {
		for _, trust := range []Trust{Trusted, Untrusted} {
			for _, sel := range sels {
				for _, ob := range obstacles {
					for _, secrets := range []bool{false, true} {
						var first Decision
						for i, src := range []Source{SourceCLI, SourceSpec, SourceEnv, SourceDefault} {
							d := Decide(DecideInputs{Mode: res(mode, src), Trust: trust, Selected: sel, Obstacle: ob, SpecHasSecretFiles: secrets})
							if d.Event != nil && d.Event.Source != string(src) {
								t.Errorf("event source %q, want %q", d.Event.Source, src)
							}
							if i == 0 {
								first = d
								continue
							}
							if d.Action != first.Action || d.Driver != first.Driver || d.FailureCode != first.FailureCode ||
								d.Status != first.Status || d.Disposition != first.Disposition ||
								(d.Event == nil) != (first.Event == nil) || (d.CLILine == "") != (first.CLILine == "") ||
								d.FileSecretsDropped != first.FileSecretsDropped {
								t.Errorf("mode %s trust %s sel %+v obstacle %v secrets %v: source %s decides %+v, source cli %+v",
									mode, trust, sel, ob, secrets, src, d, first)
							}
						}
					}
				}
			}
		}
	}
}

// TestDecideNeverSilentlyOnHost: an active mode only ever reaches the host with an event and a loud line, and
// an untrusted run never reaches it.
func TestDecideNeverSilentlyOnHost(t *testing.T) {
	for _, mode := range []string{"none", "auto", "inline"} {
		for _, trust := range []Trust{Trusted, Untrusted, ""} {
			for _, sel := range []Selection{docker, hostSel, nothing} {
				for _, ob := range []error{nil, noSandbox, explicitH, hardDocker} {
					d := Decide(DecideInputs{Mode: res(mode, SourceCLI), Trust: trust, Selected: sel, Obstacle: ob})
					if d.Action != RunOnHost {
						continue
					}
					if trust != Trusted {
						t.Errorf("untrusted (%q) run on the host: mode %s sel %+v obstacle %v", trust, mode, sel, ob)
					}
					if mode != "none" && (d.Event == nil || d.CLILine == "") {
						t.Errorf("mode %s reached the host silently: sel %+v obstacle %v", mode, sel, ob)
					}
					if mode == "none" && (d.Event != nil || d.CLILine != "") {
						t.Errorf("mode none was not silent: %+v", d)
					}
				}
			}
		}
	}
}

func TestOneLine(t *testing.T) {
	got := oneLine("a\nb\x00c" + strings.Repeat("é", 400))
	if strings.ContainsAny(got, "\n\x00") || len(got) > maxObstacle+3 || !strings.HasPrefix(got, "a b c") {
		t.Errorf("oneLine = %q", got)
	}
	if !strings.HasSuffix(got, "...") || strings.ContainsRune(got, '\uFFFD') {
		t.Errorf("oneLine cut badly: %q", got[len(got)-10:])
	}
}

func TestSetupFailure(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		code     fault.Code
		status   RunStatus
		disp     Disposition
		wantWrap error
	}{
		{name: "deadline", err: fmt.Errorf("pull: %w", context.DeadlineExceeded),
			code: fault.SandboxSetupTimeout, status: StatusFailedResumable, disp: Infrastructure, wantWrap: context.DeadlineExceeded},
		{name: "deadline inside a driver fault",
			err:  fault.Wrap(fmt.Errorf("start: %w", context.DeadlineExceeded), fault.SandboxFailed, "", "could not start"),
			code: fault.SandboxSetupTimeout, status: StatusFailedResumable, disp: Infrastructure, wantWrap: context.DeadlineExceeded},
		{name: "capacity (errdefs)", err: fmt.Errorf("create: %w", errdefs.ErrResourceExhausted),
			code: fault.SandboxCapacity, status: StatusFailedResumable, disp: Infrastructure, wantWrap: errdefs.ErrResourceExhausted},
		{name: "capacity (fault)", err: fault.New(fault.SandboxCapacity, "", "quota"),
			code: fault.SandboxCapacity, status: StatusFailedResumable, disp: Infrastructure},
		{name: "cancelled", err: fmt.Errorf("pull: %w", context.Canceled),
			code: fault.SandboxFailed, status: StatusFailed, disp: Infrastructure, wantWrap: context.Canceled},
		{name: "engine failure keeps its code", err: fault.New(fault.SandboxFailed, "", "engine said no"),
			code: fault.SandboxFailed, status: StatusFailed, disp: Infrastructure},
		{name: "missing image is deterministic", err: fault.New(fault.ImageUnavailable, "", "no such image"),
			code: fault.ImageUnavailable, status: StatusFailed, disp: Deterministic},
		{name: "a driver's own setup timeout (kube: pod not running in time) resumes",
			err:  fault.New(fault.SandboxSetupTimeout, "", "the pod was not running after 2m"),
			code: fault.SandboxSetupTimeout, status: StatusFailedResumable, disp: Infrastructure},
		{name: "a failed build is the input's", err: fault.New(fault.BuildFailed, "", "RUN false"),
			code: fault.BuildFailed, status: StatusFailed, disp: Deterministic},
		{name: "a cancelled caller is never deterministic", err: fault.Wrap(context.Canceled, fault.BuildFailed, "", "build"),
			code: fault.BuildFailed, status: StatusFailed, disp: Infrastructure},
		{name: "plain error", err: errors.New("boom"),
			code: fault.SandboxFailed, status: StatusFailed, disp: Infrastructure},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := SetupFailure(tc.err)
			if fault.CodeOf(f.Err) != tc.code || f.Status != tc.status || f.Disposition != tc.disp {
				t.Fatalf("SetupFailure = %v %s %s; want %s %s %s", f.Err, f.Status, f.Disposition, tc.code, tc.status, tc.disp)
			}
			if tc.wantWrap != nil && !errors.Is(f.Err, tc.wantWrap) {
				t.Errorf("%v does not wrap %v", f.Err, tc.wantWrap)
			}
		})
	}
	if f := SetupFailure(nil); f != (Failure{}) {
		t.Errorf("SetupFailure(nil) = %+v", f)
	}
}
