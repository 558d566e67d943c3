package channel

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// Slot is the session side of one sandbox's agent channel, the same for every driver: it holds the sandbox's
// verified agent connection, read by an agentproto.Mux (commands, concurrent commands, processes and forwarded
// streams on one connection), and hands it out. How a connection is accepted and verified is the acceptor's:
// the Unix socket with SO_PEERCRED (Listener, the Docker driver) or the pod network with a hello and a token
// (the kubernetes driver). An acceptor installs a connection only after it verified it, and asks Up first:
// while the agent's connection is up every other one is turned away, so even code that passed the
// verification cannot take over a live channel. The agent dials again only once every process of its last
// session is dead, so a new connection proves the sandbox clean.
type Slot struct {
	mu      sync.Mutex
	mux     *agentproto.Mux // the verified connection; nil when none
	arrived chan struct{}   // closed when a connection is installed; replaced after each arrival
	closed  bool
}

// NewSlot returns an empty slot.
func NewSlot() *Slot { return &Slot{arrived: make(chan struct{})} }

// Up reports whether the current connection is up. One whose peer is gone (EOF, reset) is dropped.
func (s *Slot) Up() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mux == nil {
		return false
	}
	if !s.mux.Alive() {
		s.mux.Close()
		s.mux = nil
		return false
	}
	return true
}

// Install makes c, verified by the caller, the slot's connection and reports whether it did: a slot that is
// closed, or whose connection is still up (another one got in since Up), closes c instead.
func (s *Slot) Install(c agentproto.MuxConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return false
	}
	if s.mux != nil {
		if s.mux.Alive() { // the first one stays
			c.Close()
			return false
		}
		s.mux.Close()
	}
	s.mux = agentproto.NewMux(c)
	close(s.arrived)
	s.arrived = make(chan struct{})
	return true
}

// Take returns the current connection, after checking that it is alive and idle, or waits up to wait for the
// agent to connect. The caller must hold the sandbox's gate: one command at a time uses a connection (its
// Commands); forwarded streams and concurrent commands share it (Current). After a command that broke the
// channel, the caller must call Broken.
func (s *Slot) Take(ctx context.Context, wait time.Duration) (*agentproto.Mux, error) {
	return s.current(ctx, wait, true)
}

// Current returns the current connection when it is up, or waits up to wait for the agent to connect, without
// the gate and whether a command runs on it or not: forwarded streams run alongside commands.
func (s *Slot) Current(ctx context.Context, wait time.Duration) (*agentproto.Mux, error) {
	return s.current(ctx, wait, false)
}

func (s *Slot) current(ctx context.Context, wait time.Duration, idle bool) (*agentproto.Mux, error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		s.mu.Lock()
		c, arrived, closed := s.mux, s.arrived, s.closed
		s.mu.Unlock()
		if closed {
			return nil, fmt.Errorf("%w: listener closed", ErrNoChannel)
		}
		if c != nil {
			if (idle && c.Idle()) || (!idle && c.Alive()) {
				return c, nil
			}
			s.Broken(c)
			continue
		}
		select {
		case <-arrived:
		case <-timer.C:
			return nil, ErrNoChannel
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// Broken drops c when it is the current connection: a command over it failed at the protocol level. Its
// forwarded streams end with it.
func (s *Slot) Broken(c *agentproto.Mux) {
	s.mu.Lock()
	if s.mux == c {
		s.mux = nil
	}
	s.mu.Unlock()
	c.Close()
}

// Drop closes the current connection, busy or not (the sandbox is going): whatever runs over it ends with a
// broken channel, as it would when the sandbox's processes die. The slot takes the agent's next connection.
func (s *Slot) Drop() {
	s.mu.Lock()
	c := s.mux
	s.mux = nil
	s.mu.Unlock()
	if c != nil {
		c.Close() // outside mu: it waits for the Mux's reader
	}
}

// WaitReconnect waits up to wait for a connection other than old: after a broken command, the agent reconnects
// only once every process of that command is gone, so a reconnection proves the sandbox is clean again.
func (s *Slot) WaitReconnect(ctx context.Context, old *agentproto.Mux, wait time.Duration) bool {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		s.mu.Lock()
		c, arrived := s.mux, s.arrived
		s.mu.Unlock()
		if c != nil && c != old {
			return true
		}
		select {
		case <-arrived:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// Close closes the current connection and installs no other; waiters get ErrNoChannel.
func (s *Slot) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	c := s.mux
	s.mux = nil
	close(s.arrived) // wake waiters: they see closed
	s.arrived = make(chan struct{})
	s.mu.Unlock()
	if c != nil {
		c.Close()
	}
}
