package doctor

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/diag"
)

// debian is the engine of this machine and CI: Debian 12's docker.io with runsc registered.
var debian = Engine{Version: "20.10.24+dfsg1", Runtimes: []string{"io.containerd.runc.v2", "runc", "runsc"},
	DefaultRuntime: "runc", SecurityOptions: []string{"apparmor", "seccomp", "cgroupns"}}

// TestEngineChecks: each verdict an operator would act on carries its diag code and a fix; a sound setup passes.
func TestEngineChecks(t *testing.T) {
	perKey := Sandboxes{UIDs: "200000-265535"}
	newer := debian
	newer.Version = "27.3.1"
	noSeccomp := debian
	noSeccomp.SecurityOptions = []string{"apparmor"}
	remapped := debian
	remapped.SecurityOptions = append([]string{"userns"}, debian.SecurityOptions...)
	crun := debian
	crun.DefaultRuntime = "crun"
	garbled := debian
	garbled.Version = "master-dockerproject"
	buildPids := debian
	buildPids.BuildPids, buildPids.BuildSeccomp = 512, "default"
	buildProfile := buildPids
	buildProfile.BuildSeccomp = "/etc/docker/sandkeep-seccomp.json"
	for _, tc := range []struct {
		name  string
		e     Engine
		s     Sandboxes
		check string
		want  Status
		code  diag.Code
	}{
		{"docker 20.10", debian, perKey, "engine seccomp", Warn, diag.DoctorEngineSeccompOld},
		{"docker 27", newer, perKey, "engine seccomp", Pass, ""},
		{"no seccomp", noSeccomp, perKey, "engine seccomp", Fail, diag.DoctorEngineNoSeccomp},
		{"unreadable version", garbled, perKey, "engine seccomp", Warn, diag.DoctorEngineVersion},
		{"runc", debian, perKey, "sandbox runtime", Pass, ""},
		{"runsc", debian, Sandboxes{Runtime: "runsc", UIDs: perKey.UIDs}, "sandbox runtime", Warn, diag.DoctorRuntimeGVisor},
		{"runtime missing", newer, Sandboxes{Runtime: "kata"}, "sandbox runtime", Fail, diag.DoctorRuntimeMissing},
		{"default crun", crun, perKey, "sandbox runtime", Warn, diag.DoctorRuntimeDefault},
		{"no remap", debian, perKey, "user namespaces", Pass, ""},
		{"userns-remap", remapped, perKey, "user namespaces", Warn, diag.DoctorUsernsRemap},
		{"userns-remap, uids off", remapped, Sandboxes{UIDsOff: "off"}, "user namespaces", Pass, ""},
		{"per-key uids", debian, perKey, "sandbox uids", Pass, ""},
		{"shared uid", debian, Sandboxes{UIDsOff: "sandkeep is not root"}, "sandbox uids", Warn, diag.DoctorSandboxUIDShared},
		// Issue 22, finding 3: builds run as root; doctor says what bounds them.
		{"build without pids", debian, perKey, "build limits", Warn, diag.DoctorBuildPids},
		{"build under the engine's seccomp", buildPids, perKey, "build limits", Warn, diag.DoctorBuildSeccomp},
		{"build limited", buildProfile, perKey, "build limits", Pass, ""},
	} {
		var got *Result
		for _, r := range EngineChecks(tc.e, tc.s) {
			if r.Name == tc.check {
				got = &r
			}
		}
		switch {
		case got == nil:
			t.Errorf("%s: no %q result", tc.name, tc.check)
		case tc.code == diag.DoctorRuntimeGVisor && (!strings.Contains(got.Detail, "no host-socket agent channel") ||
			!strings.Contains(got.Detail, "processes and concurrent commands go through the relay") || !strings.Contains(got.Detail, "EGRESS_UNAVAILABLE")):
			t.Errorf("%s: %q: the warning must say there is no host-socket agent channel, that processes go through the relay, and that networked commands are refused (EGRESS_UNAVAILABLE)", tc.name, got.Detail)
		case got.Status != tc.want || got.Code != string(tc.code):
			t.Errorf("%s: %s %s %q, want %s %s", tc.name, got.Status, got.Code, got.Detail, tc.want, tc.code)
		case got.Status != Pass && (got.Fix == "" || !strings.HasPrefix(got.Detail, string(tc.code)+": ")):
			t.Errorf("%s: %+v: a verdict that is not a pass says its code first and has a fix", tc.name, got)
		}
	}
}

// TestHardeningChecks: the engine is asked once for the five checks; its error fails each of them.
func TestHardeningChecks(t *testing.T) {
	calls := 0
	checks := HardeningChecks(nil, func(context.Context) (Engine, Sandboxes, error) {
		calls++
		return debian, Sandboxes{UIDs: "200000-265535"}, nil
	})
	res := Run(t.Context(), checks, 0)
	if calls != 1 || len(res) != 5 || res[0].Status != Warn || res[3].Status != Pass || ExitCode(res) != 0 {
		t.Errorf("calls %d, results %+v", calls, res)
	}
	res = Run(t.Context(), HardeningChecks(nil, func(context.Context) (Engine, Sandboxes, error) {
		return Engine{}, Sandboxes{}, errors.New("down")
	}), 0)
	for _, r := range res {
		if r.Status != Fail || !strings.Contains(r.Detail, "down") {
			t.Errorf("%+v, want a failure that says why", r)
		}
	}
}

// FuzzMajorVersion: any version string gives a positive major or none, never a panic.
func FuzzMajorVersion(f *testing.F) {
	for _, s := range []string{"20.10.24+dfsg1", "27.3.1", "", "x.y", "-1.0", "99999999999999999999.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if n, ok := majorVersion(s); ok && n <= 0 {
			t.Fatalf("%q: major %d", s, n)
		}
	})
}

// TestKubeChecks: sandbox pods under RuntimeDefault and nodes without a pods limit are warned about, with codes
// and fixes; sandkeep's Localhost profile and a bounded node pass (issue 22, Low 11).
func TestKubeChecks(t *testing.T) {
	for _, tc := range []struct {
		name          string
		k             Kube
		seccomp, pids diag.Code
	}{
		{"hardened", Kube{Seccomp: "sandkeep/seccomp-x.json", PodPidsLimit: map[string]int64{"n1": 1024}}, "", ""},
		{"runtime default", Kube{PodPidsLimit: map[string]int64{"n1": 1024}}, diag.DoctorKubeSeccomp, ""},
		{"no pids limit", Kube{Seccomp: "p", PodPidsLimit: map[string]int64{"n1": 1024, "n2": -1}}, "", diag.DoctorKubePids},
		{"huge pids limit", Kube{Seccomp: "p", PodPidsLimit: map[string]int64{"n1": 1 << 20}}, "", diag.DoctorKubePids},
		{"unreadable", Kube{Seccomp: "p", PidsErr: errors.New("forbidden")}, "", diag.DoctorKubePids},
	} {
		res := KubeChecks(tc.k)
		if len(res) != 2 || res[0].Name != "kube seccomp" || res[1].Name != "kube pids" {
			t.Fatalf("%s: %+v", tc.name, res)
		}
		for i, want := range []diag.Code{tc.seccomp, tc.pids} {
			r := res[i]
			if r.Code != string(want) || (want == "") != (r.Status == Pass) || (want != "" && (r.Fix == "" || r.Status != Warn)) {
				t.Errorf("%s: %s = %s %s %q (fix %q), want code %q", tc.name, r.Name, r.Status, r.Code, r.Detail, r.Fix, want)
			}
		}
	}
	if r := KubeChecks(Kube{PodPidsLimit: map[string]int64{"n2": -1}})[1]; !strings.Contains(r.Detail, "n2") {
		t.Errorf("the warning does not name the node: %q", r.Detail)
	}
}
