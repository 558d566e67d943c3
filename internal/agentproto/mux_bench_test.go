package agentproto

import (
	"encoding/json"
	"net"
	"slices"
	"testing"
	"time"
)

// benchAgent answers every request on c as an agent running `true` does: an accepted frame, then the result, in
// two writes.
func benchAgent(tb testing.TB, c net.Conn) {
	var buf []byte
	for {
		f, err := ReadFrame(c, &buf)
		if err != nil {
			return
		}
		if f.Type != FrameRequest {
			continue // stdin's end and the like
		}
		var req Request
		if err := json.Unmarshal(f.Payload, &req); err != nil {
			tb.Error(err)
			return
		}
		body, _ := json.Marshal(Result{ID: req.ID})
		if _, err := c.Write(appendFrame(nil, FrameAccepted, req.ID, nil)); err != nil {
			return
		}
		if _, err := c.Write(appendFrame(nil, FrameResult, req.ID, body)); err != nil {
			return
		}
	}
}

func unixPair(tb testing.TB) (host, agent net.Conn) {
	tb.Helper()
	ln, err := net.Listen("unix", tb.TempDir()+"/s")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	if agent, err = net.Dial("unix", ln.Addr().String()); err != nil {
		tb.Fatal(err)
	}
	if host, err = ln.Accept(); err != nil {
		tb.Fatal(err)
	}
	return host, agent
}

// BenchmarkMuxCommand is one warm command's round trip (request, accepted, result) on a Unix connection read
// directly by Run, as the channel was before it carried forwarded streams, and through a Mux's Commands, side by
// side in rotating blocks of 10; it reports the median of each (direct-us, mux-us) and their ratio. The Mux's
// reader is the shared channel's one extra step per frame (issue 26: 0.2-0.3 ms on a kubernetes warm command).
//
//	go test -run '^$' -bench MuxCommand -benchtime 4000x ./internal/agentproto/
func BenchmarkMuxCommand(b *testing.B) {
	dh, da := unixPair(b)
	mh, ma := unixPair(b)
	go benchAgent(b, da)
	go benchAgent(b, ma)
	m := NewMux(mh.(*net.UnixConn))
	defer func() { m.Close(); ma.Close(); dh.Close(); da.Close() }()
	conns := []Conn{dh, m.Commands()}
	lat := [2][]time.Duration{}
	id := uint32(0)
	i := 0
	for b.Loop() {
		side := (i / 10) % 2 // blocks of 10, alternating which side goes first
		i++
		id++
		t0 := time.Now()
		res, err := RunWith(b.Context(), conns[side], testRequest(id), nil, nil, nil, RunOptions{})
		if err != nil || res.ID != id {
			b.Fatalf("command %d: %+v, %v", id, res, err)
		}
		lat[side] = append(lat[side], time.Since(t0))
	}
	med := func(d []time.Duration) float64 {
		if len(d) == 0 {
			return 0
		}
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[len(s)/2].Nanoseconds()) / 1e3
	}
	direct, mux := med(lat[0]), med(lat[1])
	b.ReportMetric(direct, "direct-us")
	b.ReportMetric(mux, "mux-us")
	if direct > 0 {
		b.ReportMetric(mux/direct, "mux/direct")
	}
}
