package events

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestNewAndDecode(t *testing.T) {
	tests := []struct {
		name    string
		event   string
		payload any
	}{
		{"skipped", NameSandboxSkipped, SandboxSkipped{Mode: "auto", Source: "default", Obstacle: "no driver", FileSecretsDropped: true}},
		{"refused pointer", NameSandboxSkipped, &SandboxSkipped{Mode: "inline", Source: "cli", Refused: true}},
		{"started", NameSandboxStarted, SandboxStarted{Sandbox: "sandkeep-u-1", Driver: "docker", Image: "debian:12", Created: true, DurationMS: 12}},
		{"adopted", NameSandboxAdopted, SandboxAdopted{Sandbox: "s", Driver: "docker"}},
		{"claimed", NameSandboxClaimed, SandboxClaimed{Sandbox: "s", Driver: "docker", Template: "t", Member: "m", DurationMS: 3}},
		{"snapshot created", NameSnapshotCreated, SnapshotCreated{Snapshot: "n", Sandbox: "s", Digest: "sha256:ab", Bytes: 9, DurationMS: 3}},
		{"snapshot restored", NameSnapshotRestored, SnapshotRestored{Snapshot: "n", Sandbox: "s", Digest: "sha256:ab", Bytes: 9, DurationMS: 3}},
		{"snapshot deleted", NameSnapshotDeleted, SnapshotDeleted{Snapshot: "n", Digest: "sha256:ab", ArchiveRemoved: true}},
		{"forked", NameSandboxForked, SandboxForked{Sandbox: "s", From: "f", Driver: "docker", Template: "t", Files: 2, Bytes: 9, Reflinked: 1, DurationMS: 3}},
		{"recycled", NameSandboxRecycled, SandboxRecycled{Reason: RecyclePosture, Sandbox: "s"}},
		{"stopped idle", NameSandboxStoppedIdle, SandboxStoppedIdle{Sandbox: "s", IdleMS: 60000}},
		{"removed", NameSandboxRemoved, SandboxRemoved{Sandbox: "s", Reason: "retention"}},
		{"build started", NameSandboxBuildStarted, SandboxBuildStarted{Dockerfile: "Dockerfile", Context: "."}},
		{"build finished", NameSandboxBuildFinished, SandboxBuildFinished{Image: "sha256:ab", DurationMS: 3}},
		{"build failed", NameSandboxBuildFailed, SandboxBuildFailed{Error: "boom", DurationMS: 3}},
		{"env denied", NameSandboxEnvDenied, SandboxEnvDenied{Keys: []string{"LD_PRELOAD"}, Origin: "devcontainer.json"}},
		{"features installed", NameSandboxFeatures, SandboxFeatures{Image: "sandkeep-build-ab:latest", Features: []Feature{{ID: "./hello", Version: "1.0.0", Digest: "sha256:cd"}}, Dropped: []string{"./hello privileged: a sandbox is never privileged"}, DurationMS: 9}},
		{"post create", NameSandboxPostCreate, SandboxPostCreate{ExitCode: 2, DurationMS: 5}},
		{"post start", NameSandboxPostStart, SandboxPostStart{ExitCode: 1, DurationMS: 5, OutputTail: "boom"}},
		{"devcontainer dropped", NameDevcontainerDropped, DevcontainerDropped{Origin: "devcontainer.json",
			Items: []DevcontainerItem{{Field: "runArgs", Item: "--privileged", Why: "it gives the container power over the host", Line: 3}}}},
		{"exec started", NameExecStarted, ExecStarted{Command: "make", Workdir: "/workspace", TimeoutMS: 1000, Transport: "agent"}},
		{"exec finished", NameExecFinished, ExecFinished{ExitCode: 137, TimedOut: true, DurationMS: 1001, Transport: "exec"}},
		{"network blocked", NameNetworkBlocked, NetworkBlocked{Host: "example.com", Port: 443}},
		{"network blocked repeats", NameNetworkBlockedRepeat, NetworkBlockedRepeats{Repeats: []BlockedCount{{Host: "x.com", Port: 443, Count: 9}}, Dropped: 3}},
		{"network updated", NameNetworkUpdated, NetworkUpdated{Sandbox: "abc", Mode: "allowlist", Rules: []string{"**.x.com", "!x.com"}}},
		{"port forward opened", NamePortForwardOpened, PortForwardOpened{Sandbox: "s", Port: 8080, Conn: 1, Via: "cli"}},
		{"process started", NameProcessStarted, ProcessStarted{Sandbox: "s", PID: 7, Tag: "srv", Command: "npm", LifetimeMS: 3600000}},
		{"process ended", NameProcessEnded, ProcessEnded{Sandbox: "s", PID: 7, Reason: ProcessLifetime, ExitCode: 143, Signal: 15, DurationMS: 5}},
		{"port forward closed", NamePortForwardClosed, PortForwardClosed{Sandbox: "s", Port: 8080, Conn: 1, BytesIn: 10, BytesOut: 20, DurationMS: 5}},
		{"shared", NameSandboxShared, SandboxShared{Sandbox: "s", Driver: "docker", Adopted: true}},
		{"host binds dropped", NameHostBindsDropped, HostBindsDropped{Driver: "kubernetes", Targets: []string{"/cache"}, Withdrawn: []string{"CACHE_DIR"}}},
		{"user remap", NameUserRemap, UserRemap{Origin: RemapWorkspace, Sandbox: "s", FromUID: new(int), UID: 100100, GID: 100100}},
		{"uid mismatch", NameUIDMismatch, UIDMismatch{Sandbox: "s", OwnerUID: 1000, UID: 100100}},
		{"image env planted", NameImageEnvPlanted, ImageEnvPlanted{Sandbox: "s", Image: "i", Names: []string{"PATH", "GOPATH"}, Overridden: []string{"HOME"}}},
		{"host state mounted", NameHostStateMounted, HostStateMounted{Mode: "auto", Home: "/home/dev", Bound: []HostStatePath{{Path: "/home/dev/.gitconfig", ReadOnly: true}}, Skipped: []HostStatePath{{Path: "/home/dev/.npm", Why: "missing on the host"}}}},
		{"host service opened", NameHostServiceOpened, HostServiceOpened{Sandbox: "s", Service: "mcp", Address: "http://127.0.0.1:3130"}},
		{"host service closed", NameHostServiceClosed, HostServiceClosed{Sandbox: "s", Service: "mcp", Requests: 2}},
		{"host service refused", NameHostServiceRefused, HostServiceRefused{Sandbox: "s", Service: "mcp", Reason: "token-missing"}},
		{"host services dropped", NameHostServicesDropped, HostServicesDropped{Driver: "kubernetes", Services: []string{"mcp"}, Why: "no channel directory"}},
		{"reaper removed", NameReaperRemoved, ReaperDecision{Kind: "container", Resource: "sandkeep-u-1", Reason: "orphaned"}},
		{"reaper kept", NameReaperKept, ReaperDecision{Kind: "pod", Resource: "sandkeep-u-2", Reason: "store_unknown"}},
		{"suspended", NameSandboxSuspended, SandboxSuspended{Sandbox: "s", Template: "t", IdleMS: 600000}},
		{"resumed", NameSandboxResumed, SandboxResumed{Sandbox: "s", Driver: "docker", Template: "t", SuspendedMS: 9, DurationMS: 3}},
		{"credential reflected", NameCredentialReflected, CredentialReflected{Credential: "GITHUB_TOKEN", Host: "api.github.com", Port: 443, Where: "body"}},
	}
	covered := map[string]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := time.Now().UTC().Truncate(time.Millisecond)
			e, err := New("run-1", tt.event, tt.payload)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if e.RunID != "run-1" || e.Name != tt.event || e.Seq != 0 {
				t.Errorf("event = %+v", e)
			}
			if e.Time.Location() != time.UTC || e.Time.Before(before) || e.Time.Nanosecond()%int(time.Millisecond) != 0 {
				t.Errorf("time %v: want UTC, ms precision, not before %v", e.Time, before)
			}
			got, err := e.Decode()
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			want := reflect.ValueOf(tt.payload)
			if want.Kind() == reflect.Pointer {
				want = want.Elem()
			}
			if !reflect.DeepEqual(got, want.Interface()) {
				t.Errorf("Decode = %#v, want %#v", got, want.Interface())
			}
		})
		covered[tt.event] = true
	}
	for _, n := range Names() {
		if !covered[n] {
			t.Errorf("event %s has no test row", n)
		}
	}
	if len(Names()) != 43 {
		t.Errorf("Names() has %d names, want 43", len(Names()))
	}
}

func TestNewRejects(t *testing.T) {
	tests := []struct {
		name    string
		event   string
		payload any
	}{
		{"unknown name", "sandbox_exploded", SandboxStarted{}},
		{"wrong type", NameExecFinished, ExecStarted{}},
		{"nil", NameExecFinished, nil},
		{"nil pointer", NameExecFinished, (*ExecFinished)(nil)},
		{"map", NameExecFinished, map[string]any{"exit_code": 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New("", tt.event, tt.payload); err == nil {
				t.Fatal("New succeeded, want an error")
			}
		})
	}
}

func TestWireNames(t *testing.T) {
	e, err := New("", NameSandboxSkipped, SandboxSkipped{FileSecretsDropped: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(e.Payload), `"file_secrets_dropped":true`) {
		t.Errorf("payload %s lacks file_secrets_dropped", e.Payload)
	}
	var m map[string]any
	if err := json.Unmarshal(e.Payload, &m); err != nil {
		t.Fatal(err)
	}
}

func TestDecodeRejects(t *testing.T) {
	for _, e := range []Event{
		{Name: "nope", Payload: json.RawMessage(`{}`)},
		{Name: NameExecFinished, Payload: json.RawMessage(`{"exit_code":1,"argv":["secret"]}`)},
		{Name: NameExecFinished, Payload: json.RawMessage(`not json`)},
	} {
		if _, err := e.Decode(); err == nil {
			t.Errorf("Decode(%s %s) succeeded, want an error", e.Name, e.Payload)
		}
	}
}

func TestCommand(t *testing.T) {
	tests := []struct {
		name string
		argv []string
		want string
	}{
		{"empty", nil, ""},
		{"program only", []string{"ls"}, "ls"},
		{"arguments dropped", []string{"curl", "-H", "Authorization: Bearer s3cret"}, "curl"},
		{"long", []string{strings.Repeat("a", 300)}, strings.Repeat("a", 256)},
		{"rune boundary", []string{strings.Repeat("a", 255) + "é"}, strings.Repeat("a", 255)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Command(tt.argv)
			if got != tt.want {
				t.Errorf("Command = %q, want %q", got, tt.want)
			}
			if !utf8.ValidString(got) {
				t.Errorf("Command = %q: not valid UTF-8", got)
			}
		})
	}
}
