package engine

import (
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/compose"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// TestForwardPortsDecided: each forwardPorts form is forwarded from the sandbox's loopback or not, with why;
// a compose companion (which shares the sandbox's loopback) is forwarded, another host never is; the same local
// port twice is forwarded once.
func TestForwardPortsDecided(t *testing.T) {
	r := &repository{
		sb:         spec.Sandbox{ForwardPorts: []string{"3000", "localhost:8080", "127.0.0.1:5173", "app:9229", "db:5432", "api.example.com:443", "[::1]:9000", "3000-3005", "localhost:3000"}},
		companions: []compose.Service{{Name: "db"}},
		service:    "app",
	}
	got := r.forwardPorts()
	want := []struct {
		port      int
		companion string
		forwarded bool
		why       string
	}{
		{3000, "", true, ""},
		{8080, "", true, ""},
		{5173, "", true, ""},
		{9229, "", true, ""},
		{5432, "db", true, ""},
		{443, "", false, "api.example.com is neither the sandbox nor one of its compose companions"},
		{9000, "", false, "not to ::1"},
		{0, "", false, "does not name a port"},
		{3000, "", false, `already forwarded for "3000"`},
	}
	if len(got) != len(want) {
		t.Fatalf("%d decisions, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Entry != r.sb.ForwardPorts[i] || g.Port != w.port || g.Companion != w.companion || g.Forwarded != w.forwarded ||
			(w.why == "") != (g.Why == "") || !strings.Contains(g.Why, w.why) {
			t.Errorf("%q: %+v, want %+v", r.sb.ForwardPorts[i], g, w)
		}
	}
	if s := got[4].String(); s != `"db:5432" -> 127.0.0.1:5432 in the sandbox (compose companion db)` {
		t.Errorf("String() = %s", s)
	}
	if (&repository{}).forwardPorts() != nil {
		t.Error("no forwardPorts is not nil")
	}
}
