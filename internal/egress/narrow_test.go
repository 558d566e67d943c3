package egress

import (
	"errors"
	"net/http"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestNarrow: what a caller's block may ask of a template's policy. Host rules within the template's are
// accepted (the request-time intersection keeps them honest); an allowing IP or CIDR rule only when the
// template has that very rule; credentials, another inspection setting, wider modes and anything under a
// template with no network are NETWORK_WIDENED.
func TestNarrow(t *testing.T) {
	allow := Policy{Mode: ModeAllowlist, Rules: rules(t, "api.example.test", "**.corp.test", "!secret.corp.test", "127.0.0.1:8080"), Inspect: InspectOn}
	open := Policy{Mode: ModeOpen, Rules: rules(t, "!bad.test")}
	for _, tc := range []struct {
		name   string
		base   Policy
		caller Policy
		ok     bool
	}{
		{"none", allow, Policy{Mode: ModeNone}, true},
		{"unset mode is none", allow, Policy{}, true},
		{"a rule of the template", allow, Policy{Mode: ModeAllowlist, Rules: rules(t, "api.example.test")}, true},
		{"a name under a ** rule", allow, Policy{Mode: ModeAllowlist, Rules: rules(t, "git.corp.test", "*.a.corp.test")}, true},
		{"a negation of its own", allow, Policy{Mode: ModeAllowlist, Rules: rules(t, "**.corp.test", "!x.corp.test", "!10.0.0.0/8")}, true},
		{"the template's IP rule", allow, Policy{Mode: ModeAllowlist, Rules: rules(t, "127.0.0.1:8080")}, true},
		{"the same inspection", allow, Policy{Mode: ModeAllowlist, Rules: rules(t, "api.example.test"), Inspect: InspectOn}, true},
		{"any name under open", open, Policy{Mode: ModeAllowlist, Rules: rules(t, "evil.test", "**")}, true},
		{"another host", allow, Policy{Mode: ModeAllowlist, Rules: rules(t, "evil.test")}, false},
		{"every host", allow, Policy{Mode: ModeAllowlist, Rules: rules(t, "**")}, false},
		{"the same IP on any port", allow, Policy{Mode: ModeAllowlist, Rules: rules(t, "127.0.0.1")}, false},
		{"an IP under open", open, Policy{Mode: ModeAllowlist, Rules: rules(t, "127.0.0.1")}, false},
		{"a CIDR under open", open, Policy{Mode: ModeAllowlist, Rules: rules(t, "169.254.0.0/16")}, false},
		{"open", allow, Policy{Mode: ModeOpen}, false},
		{"denylist", allow, Policy{Mode: ModeDenylist}, false},
		{"inspection off", allow, Policy{Mode: ModeAllowlist, Rules: rules(t, "api.example.test"), Inspect: InspectOff}, false},
		{"own credentials", allow, Policy{Mode: ModeAllowlist, Rules: rules(t, "api.example.test"),
			Credentials: []Credential{{Name: "T", Placeholder: NewPlaceholder("T"), Value: "value-value", Hosts: rules(t, "api.example.test")}}}, false},
		{"no network to narrow", Policy{Mode: ModeNone}, Policy{Mode: ModeAllowlist, Rules: rules(t, "api.example.test")}, false},
		{"none from no network", Policy{Mode: ModeNone}, Policy{Mode: ModeNone}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Narrow(tc.base, tc.caller)
			if tc.ok != (err == nil) {
				t.Fatalf("Narrow = %v, want ok=%v", err, tc.ok)
			}
			if err != nil {
				var fe *fault.Error
				if fault.CodeOf(err) != fault.NetworkWidened || !errors.As(err, &fe) || fe.Hint == "" {
					t.Errorf("refusal %v: want NETWORK_WIDENED with a hint", err)
				}
				return
			}
			if got.Mode != ModeNone && (got.Inspect != tc.base.Inspect || len(got.Rules) != len(tc.base.Rules) || got.Narrow == nil) {
				t.Errorf("narrowed policy %+v lost the template's", got)
			}
		})
	}
}

// TestNarrowDecides: the proxy allows a request under a narrowed policy only when the template's policy and
// the caller's both allow it: the caller cannot drop the template's negation, cannot reach what only one of
// them lists, and a loopback address needs the IP rule of both.
func TestNarrowDecides(t *testing.T) {
	up := newEcho(t, false)
	answers := map[string][]string{
		"good.corp.test":   {"192.88.99.10"},
		"secret.corp.test": {"192.88.99.11"},
		"other.corp.test":  {"192.88.99.12"},
		"local.corp.test":  {"127.0.0.1"},
	}
	base := Policy{Mode: ModeAllowlist, Rules: rules(t, "**.corp.test", "!secret.corp.test", "127.0.0.1")}
	for _, tc := range []struct {
		name   string
		caller []string
		target string
		reason string // "": allowed
		rule   string
	}{
		{"both allow", []string{"good.corp.test"}, "good.corp.test", "", ""},
		{"the template's negation stays", []string{"**.corp.test"}, "secret.corp.test", ReasonRule, "!secret.corp.test"},
		{"the caller did not list it", []string{"good.corp.test"}, "other.corp.test", ReasonUnlisted, ""},
		{"the caller's negation", []string{"**.corp.test", "!other.corp.test"}, "other.corp.test", ReasonRule, "!other.corp.test"},
		{"loopback by the IP rule of both", []string{"127.0.0.1"}, "127.0.0.1", "", ""},
		{"loopback needs the caller's IP rule too", []string{"local.corp.test"}, "local.corp.test", ClassLoopback, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol, err := Narrow(base, Policy{Mode: ModeAllowlist, Rules: rules(t, tc.caller...)})
			if err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, pol, newRecorder(t, answers))
			resp, body := h.get(tc.target+":"+up.port(), bearer())
			switch {
			case tc.reason == "" && resp.StatusCode != http.StatusOK:
				t.Fatalf("got %d %s %q, want it allowed", resp.StatusCode, resp.Header.Get(DeniedHeader), body)
			case tc.reason != "" && (resp.StatusCode != http.StatusForbidden || resp.Header.Get(DeniedHeader) != tc.reason):
				t.Fatalf("got %d %s, want refused: %s", resp.StatusCode, resp.Header.Get(DeniedHeader), tc.reason)
			}
			if b := h.reported(); tc.reason != "" && (len(b) != 1 || b[0].Rule != tc.rule) {
				t.Errorf("blocks %+v, want one by rule %q", b, tc.rule)
			}
		})
	}
}
