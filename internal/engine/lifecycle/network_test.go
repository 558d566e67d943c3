package lifecycle

import (
	"slices"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/fault"
)

func TestMergeNetwork(t *testing.T) {
	base := &Network{Mode: "allowlist", Preset: "default", Rules: []string{"a.example"},
		Credentials: []Credential{{Name: "T", Value: "v1", Hosts: []string{"a.example"}}}}
	tests := []struct {
		name      string
		base, cmd *Network
		want      *Network
	}{
		{name: "no command block", base: base, cmd: nil, want: base},
		{name: "append adds rules after the base's", base: base, cmd: &Network{Rules: []string{"!a.example", "b.example"}},
			want: &Network{Mode: "allowlist", Preset: "default", Rules: []string{"a.example", "!a.example", "b.example"}, Credentials: base.Credentials}},
		{name: "append takes the command's mode", base: base, cmd: &Network{Mode: "none"},
			want: &Network{Mode: "none", Preset: "default", Rules: []string{"a.example"}, Credentials: base.Credentials}},
		{name: "append replaces a credential of the same name", base: base, cmd: &Network{Credentials: []Credential{{Name: "T", Value: "v2", Hosts: []string{"c.example"}}}},
			want: &Network{Mode: "allowlist", Preset: "default", Rules: []string{"a.example"}, Credentials: []Credential{{Name: "T", Value: "v2", Hosts: []string{"c.example"}}}}},
		{name: "a second preset is added as a rule", base: base, cmd: &Network{Preset: "corp"},
			want: &Network{Mode: "allowlist", Preset: "default", Rules: []string{"a.example", "preset:corp"}, Credentials: base.Credentials}},
		{name: "replace", base: base, cmd: &Network{Inherit: "replace", Mode: "open"}, want: &Network{Inherit: "replace", Mode: "open"}},
		{name: "rules on no network make an allowlist", base: nil, cmd: &Network{Rules: []string{"x.example"}},
			want: &Network{Mode: "allowlist", Rules: []string{"x.example"}}},
		{name: "rules on mode none make an allowlist", base: &Network{Mode: "none"}, cmd: &Network{Rules: []string{"x.example"}},
			want: &Network{Mode: "allowlist", Rules: []string{"x.example"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := MergeNetwork(tt.base, tt.cmd)
			if err != nil {
				t.Fatal(err)
			}
			if got.Mode != tt.want.Mode || got.Preset != tt.want.Preset || !slices.Equal(got.Rules, tt.want.Rules) ||
				!slices.EqualFunc(got.Credentials, tt.want.Credentials, func(a, b Credential) bool {
					return a.Name == b.Name && a.Value == b.Value && slices.Equal(a.Hosts, b.Hosts)
				}) {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
	if len(base.Rules) != 1 || base.Credentials[0].Value != "v1" {
		t.Errorf("merging changed the base block: %+v", base)
	}
	if _, err := MergeNetwork(base, &Network{Inherit: "merge"}); fault.CodeOf(err) != fault.NetworkInvalid {
		t.Errorf("inherit merge: %v", err)
	}
}

func TestResolveNetwork(t *testing.T) {
	presets := map[string][]string{"corp": {"**.corp.example"}}
	pol, err := ResolveNetwork(&Network{Mode: "allowlist", Preset: "default", Rules: []string{"preset:corp", "!x.corp.example"}}, presets, []string{"t.example"})
	if err != nil {
		t.Fatal(err)
	}
	if pol.Mode != egress.ModeAllowlist || len(pol.Rules) != len(defaultPreset)+2 || pol.Rules[len(pol.Rules)-1].String() != "!x.corp.example" ||
		!slices.Equal(pol.Silent, []string{"t.example"}) {
		t.Errorf("policy %+v", pol)
	}
	if m, ok := egress.Match(pol.Rules, "proxy.golang.org", 443); !ok || m == nil {
		t.Error("the default preset does not allow proxy.golang.org")
	}
	if _, ok := egress.Match(pol.Rules, "x.corp.example", 443); ok {
		t.Error("the later negation did not win over the preset")
	}
	if pol, err := ResolveNetwork(nil, nil, nil); err != nil || pol.Mode != egress.ModeNone {
		t.Errorf("nil block: %+v, %v", pol, err)
	}
	bad := []struct {
		name string
		n    *Network
		code fault.Code
		in   string
	}{
		{"mode", &Network{Mode: "strict"}, fault.NetworkInvalid, "strict"},
		{"preset", &Network{Mode: "allowlist", Preset: "nope"}, fault.NetworkInvalid, "default, corp"},
		{"rule", &Network{Mode: "allowlist", Rules: []string{"a..b"}}, fault.NetworkInvalid, "SK3"},
		{"inspect", &Network{Mode: "open", Inspect: "maybe"}, fault.NetworkInvalid, "maybe"},
		{"credential name", &Network{Mode: "open", Credentials: []Credential{{Name: "a-b", Value: "v", Hosts: []string{"x"}}}}, fault.NetworkInvalid, "a-b"},
		{"credential value", &Network{Mode: "open", Credentials: []Credential{{Name: "T", Hosts: []string{"x"}}}}, fault.SecretUnavailable, "T"},
		{"credential hosts", &Network{Mode: "open", Credentials: []Credential{{Name: "T", Value: "v"}}}, fault.NetworkInvalid, "names no host"},
		{"credential negated", &Network{Mode: "open", Credentials: []Credential{{Name: "T", Value: "v", Hosts: []string{"!x"}}}}, fault.NetworkInvalid, "negated"},
		{"credential twice", &Network{Mode: "open", Credentials: []Credential{{Name: "T", Value: "v", Hosts: []string{"x"}}, {Name: "T", Value: "w", Hosts: []string{"y"}}}}, fault.NetworkInvalid, "twice"},
		{"credentials without network", &Network{Credentials: []Credential{{Name: "T", Value: "v", Hosts: []string{"x"}}}}, fault.NetworkInvalid, "mode is none"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ResolveNetwork(tt.n, presets, nil)
			if fault.CodeOf(err) != tt.code || !strings.Contains(err.Error(), tt.in) {
				t.Errorf("got %v, want %s mentioning %q", err, tt.code, tt.in)
			}
			if err != nil && strings.Contains(err.Error(), "\"v\"") {
				t.Errorf("a credential's value is in the error: %v", err)
			}
		})
	}
}

// TestNarrowNetwork: a caller's block narrows the run's resolved policy (egress.Narrow): presets are resolved
// first, so a preset's rules count as the rules they are; credentials are refused before anything is resolved.
func TestNarrowNetwork(t *testing.T) {
	presets := map[string][]string{"corp": {"**.corp.test"}}
	base, err := ResolveNetwork(&Network{Mode: "allowlist", Preset: "default", Rules: []string{"api.example.test"}}, presets, []string{"telemetry.test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cmd  *Network
		ok   bool
	}{
		{"a rule of the preset", &Network{Mode: "allowlist", Rules: []string{"github.com"}}, true},
		{"the same preset", &Network{Mode: "allowlist", Preset: "default"}, true},
		{"another preset", &Network{Mode: "allowlist", Preset: "corp"}, false},
		{"own credentials", &Network{Mode: "allowlist", Rules: []string{"api.example.test"},
			Credentials: []Credential{{Name: "T", Value: "v", Hosts: []string{"api.example.test"}}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol, err := NarrowNetwork(base, tc.cmd, presets)
			if tc.ok != (err == nil) {
				t.Fatalf("NarrowNetwork = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && fault.CodeOf(err) != fault.NetworkWidened {
				t.Errorf("refusal %v: want NETWORK_WIDENED", err)
			}
			if err == nil && (pol.Narrow == nil || !slices.Equal(pol.Silent, base.Silent)) {
				t.Errorf("narrowed policy %+v: want the template's silent list and a narrowing", pol)
			}
		})
	}
}
