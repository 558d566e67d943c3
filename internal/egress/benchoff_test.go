package egress

import (
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestForBenchLoopbackOnly: a proxy with its checks off for the bench reaches loopback only, whatever its policy
// allows. The refusal comes before any dial: the recorder (which would map the test "internet" to loopback) is
// never asked. The same target through a proxy as the product makes it is dialled.
func TestForBenchLoopbackOnly(t *testing.T) {
	pol := Policy{Mode: ModeAllowlist, Rules: rules(t, "far.test", "192.88.99.0/24", "127.0.0.1")}
	up := rawUpstream(t, func(net.Conn) {})
	port := up[strings.LastIndexByte(up, ':')+1:]
	for _, bench := range []bool{false, true} {
		rec := newRecorder(t, map[string][]string{"far.test": {"192.88.99.7"}, "near.test": {"127.0.0.1"}})
		p, err := New(Config{Policy: pol, Token: testToken, Resolver: rec, Dial: rec.Dial})
		if err != nil {
			t.Fatal(err)
		}
		if bench {
			ForBench(p, BenchOff{HelloCheck: true, Token: true})
		}
		h := &harness{t: t, rec: rec}
		h.start(p)
		resp, _, _ := h.connect("far.test:"+port, bearer())
		switch {
		case bench && (resp.StatusCode != http.StatusBadGateway || len(rec.dialed()) != 0):
			t.Errorf("bench proxy: CONNECT far.test: %s, dialled %v; want 502 and no dial", resp.Status, rec.dialed())
		case !bench && (resp.StatusCode != http.StatusOK || len(rec.dialed()) != 1):
			t.Errorf("product proxy: CONNECT far.test: %s, dialled %v; want 200 and one dial", resp.Status, rec.dialed())
		}
	}
}

// TestForBenchToken: BenchOff.Token lets a CONNECT in without the token (the bench's "off" side); a proxy as the
// product makes it asks for it.
func TestForBenchToken(t *testing.T) {
	up := rawUpstream(t, func(net.Conn) {})
	target := "127.0.0.1:" + up[strings.LastIndexByte(up, ':')+1:]
	pol := Policy{Mode: ModeAllowlist, Rules: rules(t, "127.0.0.1")}
	for _, off := range []bool{false, true} {
		rec := newRecorder(t, nil)
		p, err := New(Config{Policy: pol, Token: testToken, Resolver: rec, Dial: rec.Dial})
		if err != nil {
			t.Fatal(err)
		}
		ForBench(p, BenchOff{Token: off})
		h := &harness{t: t, rec: rec}
		h.start(p)
		want := http.StatusProxyAuthRequired
		if off {
			want = http.StatusOK
		}
		if resp, _, _ := h.connect(target, ""); resp.StatusCode != want {
			t.Errorf("token off %v: CONNECT without a token: %s, want %d", off, resp.Status, want)
		}
	}
}
