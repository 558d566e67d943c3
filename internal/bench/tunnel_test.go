package bench

import "testing"

// TestTunnel keeps the tunnel scenario working (two blocks of 1 MiB through the real proxy, side listener and
// handoff); it checks the rows, never the speed.
func TestTunnel(t *testing.T) {
	rows, err := tunnel(t.Context(), 2, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 6 {
		t.Fatalf("%d rows, want upload and download, handed off, copied and the minimal relay", len(rows))
	}
	for _, r := range rows[:2] {
		if r.Extra["of_minimal_relay"] == "" {
			t.Errorf("row %q has no of_minimal_relay", r.Scenario)
		}
	}
	for _, r := range rows {
		if r.Sandkeep.N != 2 || r.Base.N != 2 || r.Sandkeep.Median <= 0 || r.Base.Median <= 0 || r.Extra["throughput_ratio"] == "" {
			t.Errorf("row %+v", r)
		}
	}
}

// BenchmarkTunnelSideBySide is the tunnel scenario as a Go benchmark, each iteration one block:
//
//	go test -run x -bench TunnelSideBySide -benchtime 15x ./internal/bench/
func BenchmarkTunnelSideBySide(b *testing.B) {
	rows, err := tunnel(b.Context(), b.N, TunnelBytes)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(4 * TunnelBytes)
	for i, name := range []string{"up", "down", "copied-up", "copied-down", "relay-up", "relay-down"} {
		r := rows[i]
		b.ReportMetric(float64(TunnelBytes)/1e6/r.Sandkeep.Median.Seconds(), name+"-proxy-MB/s")
		b.ReportMetric(float64(TunnelBytes)/1e6/r.Base.Median.Seconds(), name+"-direct-MB/s")
		b.ReportMetric(float64(r.Base.Median)/float64(r.Sandkeep.Median), name+"-ratio")
	}
}
