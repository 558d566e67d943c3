package lifecycle

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/channel"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// One key's egress proxy is served by one process of the home: the first that listened on the sandbox's egress
// socket (the server, the daemon, a CLI call). Another process of the home (a CLI call with its own operator
// input, a second server) runs a networked command of that key through the owner's proxy: it asks the owner, on
// the key's owner socket in the home (never in the sandbox's view), to begin a session with the policy and token
// this process's own admission decided, and holds the session open for the command's life. The caller holds the
// key's gate (a file lock every process of the home shares), so the owner's own commands of the key wait for it
// as for one of its own. The owner sends the session's refusals and reflections back, and they are recorded in
// the caller's run, as its own would be. Only processes of the home's user (or root) may connect.

// ownerSocket is where the process that serves key's egress proxy takes sessions of other processes.
func (h *Home) ownerSocket(k identity.Key) string {
	return filepath.Join(h.Dir, "owners", h.phys(k).Short()+".sock")
}

// ownerRequest is a session asked of the owner; ownerAnswer its answer, then ownerNote lines until the caller
// hangs up.
type ownerRequest struct {
	Policy egress.Policy `json:"policy"`
	Token  string        `json:"token"`
}

type ownerAnswer struct {
	CA    bool           `json:"ca,omitempty"` // the sandbox's CA bundle is in place (CABundlePath)
	Error *ownerErrorMsg `json:"error,omitempty"`
}

type ownerErrorMsg struct {
	Code    fault.Code `json:"code"`
	Message string     `json:"message"`
	Hint    string     `json:"hint,omitempty"`
}

type ownerNote struct {
	Block     *egress.Block      `json:"block,omitempty"`
	Reflected *egress.Reflection `json:"reflected,omitempty"`
}

// serveOwner takes other processes' sessions on ke's proxy until ln closes. It runs on its own goroutine, which
// ke.close waits for.
func (m *Manager) serveOwner(key identity.Key, ke *keyEgress, dir string) {
	defer close(ke.ownerDone)
	var wg sync.WaitGroup
	var mu sync.Mutex
	open := map[*net.UnixConn]bool{}
	for {
		c, err := ke.owner.AcceptUnix()
		if err != nil {
			break
		}
		if !sameUser(c) {
			c.Close()
			continue
		}
		mu.Lock()
		open[c] = true
		mu.Unlock()
		wg.Go(func() {
			defer func() {
				mu.Lock()
				delete(open, c)
				mu.Unlock()
				c.Close()
			}()
			m.ownerSession(key, ke, dir, c)
		})
	}
	// The proxy is going away: its sessions end with it.
	mu.Lock()
	for c := range open {
		c.Close()
	}
	mu.Unlock()
	wg.Wait()
}

// sameUser reports whether c's peer runs as this process's user or as root.
func sameUser(c *net.UnixConn) bool {
	cred, err := channel.PeerCred(c)
	if err != nil {
		return false
	}
	return cred.Uid == uint32(os.Getuid()) || cred.Uid == 0
}

// ownerSession is the owner's side of one session: begin it, send the refusals, end it when the caller hangs up.
func (m *Manager) ownerSession(key identity.Key, ke *keyEgress, dir string, c *net.UnixConn) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var req ownerRequest
	if err := json.NewDecoder(c).Decode(&req); err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	var mu sync.Mutex
	enc := json.NewEncoder(c)
	send := func(v any) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(v)
	}
	answer := ownerAnswer{}
	ca, err := m.ownerBundle(key, ke, dir)
	if err == nil {
		err = ke.proxy.Begin(req.Policy, req.Token)
	}
	if err != nil {
		var fe *fault.Error
		if !errors.As(err, &fe) {
			fe = fault.Wrap(err, fault.NetworkInvalid, "check the network block", "network policy refused")
		}
		answer.Error = &ownerErrorMsg{Code: fe.Code, Message: fe.Message, Hint: fe.Hint}
		send(answer)
		return
	}
	ke.proxy.SetOnBlocked(func(b egress.Block) { send(ownerNote{Block: &b}) })
	ke.proxy.SetOnReflected(func(r egress.Reflection) { send(ownerNote{Reflected: &r}) })
	answer.CA = ca
	send(answer)
	// The caller sends nothing more: a read returns when it hangs up (its command is over, or it died).
	_, _ = c.Read(make([]byte, 1))
	ke.proxy.End()
	ke.proxy.SetOnBlocked(m.blockedSink(context.Background(), key))
	ke.proxy.SetOnReflected(m.reflectedSink(context.Background(), key))
}

// ownerBundle writes the CA bundle of key's sandbox as the owner's own commands do; false when the proxy has no CA.
func (m *Manager) ownerBundle(key identity.Key, ke *keyEgress, dir string) (bool, error) {
	ca, gen := ke.proxy.CA()
	if ca == nil {
		return false, nil
	}
	sb := m.cached(key)
	if sb == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		if sb, err = m.inspectKey(ctx, key); err != nil {
			return false, err
		}
	}
	if err := m.writeBundle(sb, ke, dir, ca, gen); err != nil {
		return false, err
	}
	return true, nil
}

// listenOwner listens on key's owner socket for the proxy this process just started.
func (m *Manager) listenOwner(key identity.Key) (*net.UnixListener, error) {
	path := m.home.ownerSocket(key)
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	_ = os.Remove(path) // a previous owner's: this process holds the egress socket now, so that one is gone
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), filepath.Base(path)), Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	return ln, os.Chmod(path, 0o600)
}

// egressThroughOwner is egressFor for a key whose proxy another process of the home serves (inUse is the
// refusal of its egress socket): the session is the owner's, the policy and token this command's.
func (m *Manager) egressThroughOwner(ctx context.Context, key identity.Key, pol *egress.Policy, inUse error) (env []string, release func(), err error) {
	release = func() {}
	conn, err := channel.Dial(m.home.ownerSocket(key), 2*time.Second)
	if err != nil {
		return nil, release, inUse // an owner of an older sandkeep, or one going away: nothing to ask
	}
	p := *pol
	p.Credentials = make([]egress.Credential, len(pol.Credentials))
	for i, c := range pol.Credentials {
		c.Placeholder = egress.NewPlaceholder(c.Name)
		p.Credentials[i] = c
		env = append(env, c.Name+"="+c.Placeholder)
	}
	token, err := newToken()
	if err != nil {
		conn.Close()
		return nil, release, err
	}
	if err := json.NewEncoder(conn).Encode(ownerRequest{Policy: p, Token: token}); err != nil {
		conn.Close()
		return nil, release, fault.Wrap(err, fault.EgressUnavailable, "retry: the process that serves this user's network went away", "cannot reach it")
	}
	rd := bufio.NewReader(conn)
	dec := json.NewDecoder(rd)
	var ans ownerAnswer
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if err := dec.Decode(&ans); err != nil {
		conn.Close()
		return nil, release, fault.Wrap(err, fault.EgressUnavailable, "retry: the process that serves this user's network went away",
			"no answer from the process that serves the network of sandbox %s", key.ContainerName())
	}
	_ = conn.SetReadDeadline(time.Time{})
	if ans.Error != nil {
		conn.Close()
		return nil, release, fault.New(ans.Error.Code, ans.Error.Hint, "%s", ans.Error.Message)
	}
	tally := newBlockTally(func(ev events.NetworkBlocked) { m.emit(ctx, events.NameNetworkBlocked, ev) })
	reflected := m.reflectedSink(ctx, key)
	notes := make(chan struct{})
	go func() { // owned by release, which closes conn and waits for it
		defer close(notes)
		for {
			var n ownerNote
			if err := dec.Decode(&n); err != nil {
				return
			}
			if n.Block != nil {
				tally.add(blockedEvent(key, *n.Block))
			}
			if n.Reflected != nil {
				reflected(*n.Reflected)
			}
		}
	}()
	release = func() {
		conn.Close()
		<-notes
		if rep, ok := tally.flush(); ok {
			rep.Sandbox, rep.Key = key.ContainerName(), key.Short()
			m.emit(ctx, events.NameNetworkBlockedRepeat, rep)
		}
	}
	proxyURL := "http://sandkeep:" + token + "@" + EgressListen
	env = append(env,
		"HTTP_PROXY="+proxyURL, "HTTPS_PROXY="+proxyURL, "http_proxy="+proxyURL, "https_proxy="+proxyURL,
		"NO_PROXY="+noProxy, "no_proxy="+noProxy)
	if ans.CA {
		for _, k := range []string{"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"} {
			env = append(env, k+"="+CABundlePath)
		}
	}
	return env, release, nil
}
