package bench

import (
	"strings"
	"testing"
)

// TestConnectRows keeps the connect scenario's CONNECT part working (a few blocks through the four real proxies
// to the loopback TLS server); it checks the rows' shape, never the speed. The exec row is in TestScenariosRun.
func TestConnectRows(t *testing.T) {
	rows, err := Connect(t.Context(), nil, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	checks := []string{"hello+token", "hello", "token"}
	if len(rows) != len(checks) {
		t.Fatalf("%d rows, want both, the hello check and the token: %+v", len(rows), rows)
	}
	for i, r := range rows {
		if r.Sandkeep.N != 3 || r.Base.N != 3 || r.Sandkeep.Median <= 0 || r.Base.Median <= 0 || r.Ratio <= 0 {
			t.Errorf("row %d: %+v", i, r)
		}
		if r.Extra["checks"] != checks[i] || r.Extra["added_ms_per_CONNECT"] == "" || r.Extra["paired_median_ms"] == "" ||
			r.Extra["bar"] != "<0.100 ms" || r.Extra["noise_ms"] == "" ||
			(r.Extra["meets"] != "yes" && r.Extra["meets"] != "no" && r.Extra["meets"] != "undecided") {
			t.Errorf("row %d's notes: %v", i, r.Extra)
		}
		if !strings.Contains(r.String(), "CONNECT") {
			t.Errorf("row %d: %s", i, r)
		}
	}
}
