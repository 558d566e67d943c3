package engine

import (
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestNarrows: a caller's network block may only narrow its run's: mode none, or an allowlist of the run's own
// rules (or its preset's) without credentials; anything wider is NETWORK_WIDENED.
func TestNarrows(t *testing.T) {
	base := &Network{Mode: "allowlist", Preset: "default", Rules: []string{"api.example.test", "**.corp.test"}}
	for _, tc := range []struct {
		name string
		base *Network
		cmd  *Network
		ok   bool
	}{
		{"none", base, &Network{Mode: "none"}, true},
		{"unset mode is none", base, &Network{}, true},
		{"a subset of the rules", base, &Network{Mode: "allowlist", Rules: []string{"api.example.test"}}, true},
		{"a rule of the preset", base, &Network{Mode: "allowlist", Rules: []string{"github.com"}}, true},
		{"the same preset", base, &Network{Mode: "allowlist", Preset: "default"}, true},
		{"another rule", base, &Network{Mode: "allowlist", Rules: []string{"evil.test"}}, false},
		{"a wider wildcard", base, &Network{Mode: "allowlist", Rules: []string{"**"}}, false},
		{"another preset", base, &Network{Mode: "allowlist", Preset: "corp"}, false},
		{"open", base, &Network{Mode: "open"}, false},
		{"denylist", base, &Network{Mode: "denylist"}, false},
		{"own credentials", base, &Network{Mode: "allowlist", Rules: []string{"api.example.test"},
			Credentials: []Credential{{Name: "T", Value: "v", Hosts: []string{"api.example.test"}}}}, false},
		{"no network to narrow", nil, &Network{Mode: "allowlist", Rules: []string{"api.example.test"}}, false},
		{"none from no network", nil, &Network{Mode: "none"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := narrows(tc.base, tc.cmd, map[string][]string{"corp": {"**.corp.test"}})
			if tc.ok != (err == nil) {
				t.Fatalf("narrows = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && (fault.CodeOf(err) != fault.NetworkWidened || hintOf(err) == "") {
				t.Errorf("refusal %v: want NETWORK_WIDENED with a hint", err)
			}
		})
	}
}

func hintOf(err error) string {
	if fe, ok := err.(*fault.Error); ok {
		return fe.Hint
	}
	return ""
}
