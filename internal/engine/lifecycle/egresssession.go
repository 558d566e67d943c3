package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"

	"github.com/sandkeep/sandkeep/internal/channel"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Concurrent egress sessions: a concurrent command, and a process for its whole life, is a session of the key's
// proxy of its own (egress.Proxy.Open) beside the others in flight: its own token in its HTTP(S)_PROXY (the token
// is all that ties a request to its session), its own policy, its own credential values (injected into its own
// requests only) and, when its policy inspects TLS, its own CA in a bundle file of its own. Its refusals are
// network_blocked events of its own run; ending it (the command returns, the process ends) closes what it opened
// and nothing of the other sessions'.

// sessionBundlePrefix names a concurrent session's CA bundle in the channel directory.
const sessionBundlePrefix = "ca-bundle-"

// egressSession opens a concurrent session of key's proxy for one command or process with policy pol and returns
// the environment it needs; release ends the session (never nil). Its events go to sink. A command without a
// network gets none, as egressFor's; the exclusive session of the proxy is left as it is.
func (m *Manager) egressSession(ctx context.Context, key identity.Key, sb *driver.Sandbox, pol *egress.Policy, block bool, sink Sink) (env []string, release func(), err error) {
	release = func() {}
	if noNetwork(pol) {
		return nil, release, m.proveNoNetwork(ctx, sb, block)
	}
	ke, dir, err := m.keyProxy(ctx, key, sb)
	if errors.Is(err, channel.ErrInUse) {
		return nil, release, fault.Wrap(err, fault.EgressUnavailable,
			"run it through the sandkeep process that serves this sandbox (the server or the daemon)",
			"another sandkeep process serves the network of sandbox %s: a concurrent command or process cannot have a session there", key.ContainerName())
	}
	if err != nil || ke == nil {
		return nil, release, err
	}
	p, env := ke.withPlaceholders(pol)
	token, err := newToken()
	if err != nil {
		return nil, release, err
	}
	tally := newBlockTally(func(ev events.NetworkBlocked) { sink(events.NameNetworkBlocked, ev) })
	s, err := ke.proxy.Open(p, egress.SessionConfig{
		Token:     token,
		OnBlocked: func(b egress.Block) { tally.add(blockedEvent(key, b)) },
		OnReflected: func(r egress.Reflection) {
			sink(events.NameCredentialReflected, events.CredentialReflected{Credential: r.Credential, Host: r.Host,
				Port: int(r.Port), Where: r.Where, Sandbox: key.ContainerName(), Key: key.Short()})
		},
	})
	if err != nil {
		return nil, release, fault.Wrap(err, fault.NetworkInvalid, "check the network block", "network policy refused")
	}
	bundle := ""
	release = func() {
		s.End()
		if rep, ok := tally.flush(); ok {
			rep.Sandbox, rep.Key = key.ContainerName(), key.Short()
			sink(events.NameNetworkBlockedRepeat, rep)
		}
		if bundle != "" {
			_ = os.Remove(bundle)
		}
	}
	env = append(env, proxyEnv(token)...)
	if ca := s.CA(); ca != nil {
		if dir == "" { // concurrentOK keeps such a command exclusive: a session's bundle needs the channel directory
			release()
			return nil, func() {}, fault.New(fault.EgressUnavailable, "run the command without Concurrent",
				"a concurrent command's TLS inspection needs the sandbox's channel directory, which the %s driver has not", m.drv.Name())
		}
		name := sessionBundlePrefix + token[:16] + ".pem"
		if err := replaceFile(filepath.Join(dir, name), bytes.NewReader(append(ca, ke.imageRootsOf(m, sb)...)), 0o644); err != nil {
			release()
			return nil, func() {}, fault.Wrap(err, fault.EgressUnavailable, "check that the state home is writable", "cannot write the command's CA bundle")
		}
		bundle = filepath.Join(dir, name)
		env = append(env, bundleEnv(channel.MountPoint+"/"+name)...)
	}
	return env, release, nil
}

// imageRootsOf is the trust store of sb's image (imageRoots), read once per container.
func (ke *keyEgress) imageRootsOf(m *Manager, sb *driver.Sandbox) []byte {
	ke.mu.Lock()
	defer ke.mu.Unlock()
	if sb.ID != ke.rootsOf {
		ke.roots, ke.rootsOf = m.imageRoots(sb), sb.ID
	}
	return slices.Clip(ke.roots)
}
