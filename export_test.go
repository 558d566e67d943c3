package sandkeep

import (
	"context"
	"crypto/x509"
	"net"

	"github.com/sandkeep/sandkeep/internal/egress"
)

// SetEgressHooks points c's egress proxies at a test resolver and test upstream roots (the tests' "internet").
func SetEgressHooks(c *Config, r egress.Resolver, roots *x509.CertPool) {
	c.egressResolver, c.egressRoots = r, roots
}

// DialPortExec opens a forwarded connection the fallback way, one engine exec of the agent per connection,
// whether or not this manager has the sandbox's channel: the other side of the port-forward benchmark.
func DialPortExec(ctx context.Context, m *Manager, key Key, port int) (net.Conn, error) {
	return m.e.DialPortExec(ctx, key, port)
}
