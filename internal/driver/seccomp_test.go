package driver

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

type profile struct {
	DefaultAction   string `json:"defaultAction"`
	DefaultErrnoRet *uint  `json:"defaultErrnoRet"`
	Syscalls        []rule `json:"syscalls"`
}

type rule struct {
	Names    []string `json:"names"`
	Action   string   `json:"action"`
	ErrnoRet *uint    `json:"errnoRet"`
	Args     []struct {
		Index uint   `json:"index"`
		Value uint64 `json:"value"`
		Op    string `json:"op"`
	} `json:"args"`
	Includes map[string]any `json:"includes"`
	Excludes map[string]any `json:"excludes"`
}

// TestSeccompProfileDenies: the profile refuses by default with EPERM, allows none of DeniedSyscalls outright,
// lets clone and unshare through only without CLONE_NEW* flags, and depends on no capability (a sandbox has
// none, and a rule keyed on one would change meaning with the posture's CapDrop).
func TestSeccompProfileDenies(t *testing.T) {
	var p profile
	if err := json.Unmarshal([]byte(SeccompProfile()), &p); err != nil {
		t.Fatal(err)
	}
	if p.DefaultAction != "SCMP_ACT_ERRNO" || p.DefaultErrnoRet == nil || *p.DefaultErrnoRet != 1 {
		t.Fatalf("default action %s errno %v, want SCMP_ACT_ERRNO with EPERM", p.DefaultAction, p.DefaultErrnoRet)
	}
	const newNamespaces = 0x7E020000 // CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
	denied := map[string]bool{}
	for _, d := range DeniedSyscalls {
		if d.Why == "" {
			t.Errorf("%v: no reason given", d.Names)
		}
		for _, n := range d.Names {
			denied[n] = true
		}
	}
	for _, s := range p.Syscalls {
		if _, ok := s.Includes["caps"]; ok {
			t.Errorf("rule for %v depends on capabilities", s.Names)
		}
		if _, ok := s.Excludes["caps"]; ok {
			t.Errorf("rule for %v depends on capabilities", s.Names)
		}
		if s.Action != "SCMP_ACT_ALLOW" {
			continue
		}
		for _, n := range s.Names {
			if !denied[n] {
				continue
			}
			masked := len(s.Args) == 1 && s.Args[0].Index == 0 && s.Args[0].Op == "SCMP_CMP_MASKED_EQ" &&
				s.Args[0].Value&newNamespaces == newNamespaces
			if (n == "clone" || n == "unshare") && masked {
				continue
			}
			t.Errorf("%s is allowed by a rule (%d args): it is in DeniedSyscalls", n, len(s.Args))
		}
	}
	i := slices.IndexFunc(p.Syscalls, func(s rule) bool {
		return slices.Equal(s.Names, []string{"clone3"})
	})
	if i < 0 || p.Syscalls[i].ErrnoRet == nil || *p.Syscalls[i].ErrnoRet != 38 {
		t.Error("clone3 must fail with ENOSYS, so libcs fall back to clone")
	}
	if strings.ContainsAny(SeccompProfile(), "\n\t") {
		t.Error("the profile handed to the engine is not compact")
	}
}
