package sandkeep

import (
	"crypto/x509"

	"github.com/sandkeep/sandkeep/internal/egress"
)

// SetEgressHooks points c's egress proxies at a test resolver and test upstream roots (the tests' "internet").
func SetEgressHooks(c *Config, r egress.Resolver, roots *x509.CertPool) {
	c.egressHooks = egressHooks{resolver: r, roots: roots}
}
