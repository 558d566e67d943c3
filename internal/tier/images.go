package tier

import (
	"net"
	"strings"

	"github.com/distribution/reference"
)

// validRegistry reports whether r is written as a registry's host or host:port.
func validRegistry(r string) bool {
	return r != "" && !strings.ContainsAny(r, "/ @\t\n")
}

// ImageRegistry returns the registry an image reference names ("docker.io" for a short name such as alpine),
// lowercased, and whether the operator lists it in image_registries (by host:port, or by host for any
// port). A ref that does not parse as an image reference is never allowed: its registry is "".
func (op Operator) ImageRegistry(ref string) (registry string, allowed bool) {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", false
	}
	registry = strings.ToLower(reference.Domain(named))
	return registry, RegistryListed(op.ImageRegistries, registry)
}

// RegistryListed reports whether hostport ("host" or "host:port") is in list, whose entries are a host (any
// port) or a host:port, compared without case.
func RegistryListed(list []string, hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	for _, a := range list {
		if strings.EqualFold(a, hostport) || strings.EqualFold(a, host) {
			return true
		}
	}
	return false
}
