package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
)

// BenchOff names the checks `sandkeep bench` times against their absence, side by side (internal/bench, the
// connect scenario). No configuration, flag, environment variable or API reaches it: only the bench's own
// proxies, which it makes and serves itself on loopback, are ever changed.
type BenchOff struct {
	HelloCheck bool // plain tunnels forward the client's first bytes without reading a ClientHello
	Token      bool // requests are not authenticated and carry no session (the per-command token's whole path)
}

// ForBench turns o's checks off on p, which must not be serving yet. A proxy it changed dials loopback addresses
// only, whatever its policy allows, so that a proxy without its checks can reach nothing but the bench's own
// servers.
func ForBench(p *Proxy, o BenchOff) {
	p.noPeek, p.noAuth = o.HelloCheck, o.Token
	dial := p.dial
	p.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil || !ap.Addr().IsLoopback() {
			return nil, fmt.Errorf("egress proxy (bench): %s is not a loopback address", addr)
		}
		return dial(ctx, network, addr)
	}
}
