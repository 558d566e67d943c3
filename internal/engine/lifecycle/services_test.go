package lifecycle

import (
	"strings"
	"sync/atomic"
	"testing"
)

// TestServiceAdmit: a host service lets a request through only with the bearer token of a run that has it open
// now, for that service; a missing, malformed, foreign or closed token is refused with its reason.
func TestServiceAdmit(t *testing.T) {
	ks := &keyServices{open: map[string]map[string]int{"mcp": {"tok-a": 1, "tok-b": 2}, "ask": {"tok-c": 1}},
		requests: map[string]*atomic.Int64{"mcp": {}, "ask": {}}}
	for _, tc := range []struct{ service, auth, want string }{
		{"mcp", "Bearer tok-a", ""},
		{"mcp", "Bearer tok-b", ""},
		{"mcp", "", "token-missing"},
		{"mcp", "Bearer ", "token-missing"},
		{"mcp", "Basic dG9rLWE=", "token-missing"},
		{"mcp", "bearer tok-a", "token-missing"},
		{"mcp", "Bearer tok-c", "token-invalid"}, // another service's run token
		{"mcp", "Bearer tok-a ", "token-invalid"},
		{"mcp", "Bearer tok", "token-invalid"},
		{"nope", "Bearer tok-a", "token-invalid"},
	} {
		if got := ks.admit(tc.service, tc.auth); got != tc.want {
			t.Errorf("admit(%s, %q) = %q, want %q", tc.service, tc.auth, got, tc.want)
		}
	}
	if n := ks.requests["mcp"].Load(); n != 2 {
		t.Errorf("%d requests counted, want the 2 let through", n)
	}
}

// FuzzParseHostService: an operator's host service is a name of [a-z0-9_-] and an http(s) URL with a host and no
// user, query or fragment; whatever it accepts names a variable of its own.
func FuzzParseHostService(f *testing.F) {
	for _, s := range [][2]string{{"mcp", "http://127.0.0.1:8931/mcp"}, {"ask-user", "https://localhost"}, {"x", "ftp://h"},
		{"A", "http://h"}, {"mcp", "http://u:p@h"}, {"mcp", "http://h/?q"}, {"", ""}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, name, raw string) {
		s, err := ParseHostService(name, raw)
		if err != nil {
			return
		}
		if s.URL == nil || (s.URL.Scheme != "http" && s.URL.Scheme != "https") || s.URL.Host == "" || s.URL.User != nil {
			t.Fatalf("accepted %q %q as %+v", name, raw, s.URL)
		}
		env := ServiceEnvName(s.Name)
		if strings.ContainsAny(env, "=- \x00") || !strings.HasPrefix(env, "SANDKEEP_SERVICE_") {
			t.Fatalf("service %q names the variable %q", name, env)
		}
	})
}
