package main

import (
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// The fleet block: leader is store or kubernetes (anything else is refused naming it), and advertise names this
// replica's own address from the environment (deploy/'s `${POD_IP}:7879`), so one config serves every replica.
func TestOpenFleetLeaderAndAdvertise(t *testing.T) {
	t.Setenv("SANDKEEP_FLEET_SECRET", strings.Repeat("s", 32))
	t.Setenv("POD_IP", "10.1.2.3")
	base := fleetConfig{Listen: "127.0.0.1:0", SecretEnv: "SANDKEEP_FLEET_SECRET", Installation: strings.Repeat("a", 32)}
	for _, tc := range []struct {
		leader, advertise, wantAddr string
		ok                          bool
	}{
		{"", "", "", true},
		{"store", "${POD_IP}:7879", "10.1.2.3:7879", true},
		{"kubernetes", "$POD_IP:7879", "10.1.2.3:7879", true},
		{"etcd", "", "", false},
	} {
		g := &globals{home: t.TempDir()}
		fc := base
		fc.Leader, fc.Advertise = tc.leader, tc.advertise
		f, err := g.openFleet(fc)
		if !tc.ok {
			if fault.CodeOf(err) != fault.InvalidArgument || !strings.Contains(err.Error(), "leader") {
				t.Errorf("leader %q: %v, want INVALID_ARGUMENT naming leader", tc.leader, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("leader %q: %v", tc.leader, err)
		}
		f.ln.Close()
		if tc.wantAddr != "" && f.address != tc.wantAddr {
			t.Errorf("advertise %q: address %q, want %q", tc.advertise, f.address, tc.wantAddr)
		}
	}
}
