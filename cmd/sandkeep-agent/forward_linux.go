package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// forwarder is the agent's side of port forwarding on the channel (internal/agentproto/forward.go): the host
// opens a stream to a loopback port, the agent connects to it from inside the sandbox's network namespace and
// relays both ways. Only the serve loop calls handle; each connected stream has two relay goroutines, owned by
// the forwarder (wg).
type forwarder struct {
	fw    *agentproto.FrameWriter
	table *agentproto.ForwardTable
	wg    sync.WaitGroup
	ctx   context.Context // cancelled by stop: dials in progress give up
	stop  context.CancelFunc
}

func newForwarder(fw *agentproto.FrameWriter) *forwarder {
	ctx, cancel := context.WithCancel(context.Background())
	return &forwarder{fw: fw, table: agentproto.NewForwardTable(fw, nil), ctx: ctx, stop: cancel}
}

// forward handles a forward frame and reports whether f was one; s.fwd is made on the first.
func (s *server) forward(f agentproto.Frame) (bool, error) {
	if !agentproto.IsForwardFrame(f.Type) {
		return false, nil
	}
	if s.fwd == nil {
		s.fwd = newForwarder(s.fw)
	}
	return true, s.fwd.handle(f)
}

// closeForwards ends every stream (the channel is gone) and waits for their relays.
func (s *server) closeForwards() {
	if s.fwd == nil {
		return
	}
	s.fwd.stop()
	s.fwd.table.CloseAll(net.ErrClosed)
	s.fwd.wg.Wait()
}

func (fd *forwarder) handle(f agentproto.Frame) error {
	switch f.Type {
	case agentproto.FrameForwardOpen:
		target, err := agentproto.DecodeForwardOpen(f.Payload)
		if err != nil {
			return err
		}
		if err := agentproto.CheckForwardTarget(target); err != nil {
			// Refused before any connect: a forward reaches only the sandbox's own loopback.
			return fd.reply(f.ID, agentproto.ForwardRefused, err.Error())
		}
		st, err := fd.table.Add(f.ID)
		if err != nil {
			return fd.reply(f.ID, agentproto.ForwardRefused, err.Error())
		}
		fd.wg.Add(1)
		go func() { // the serve loop never waits for a connect
			defer fd.wg.Done()
			fd.connect(st, f.ID, target.String())
		}()
		return nil
	case agentproto.FrameForwardReply:
		return fmt.Errorf("%w: unexpected frame %v from the host", agentproto.ErrProtocol, f.Type)
	}
	return fd.table.Handle(f)
}

func (fd *forwarder) reply(id uint32, code byte, reason string) error {
	return fd.fw.WriteFrame(agentproto.FrameForwardReply, id, agentproto.EncodeForwardReply(code, reason))
}

// connect dials target and relays until both directions are done. A stream the host closed while the dial was
// under way is dropped with the connection.
func (fd *forwarder) connect(st *agentproto.Stream, id uint32, target string) {
	ctx, cancel := context.WithTimeout(fd.ctx, dialTimeout)
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", target)
	cancel()
	if err != nil {
		fd.table.Drop(id)
		_ = fd.reply(id, agentproto.ForwardUnreachable, err.Error())
		return
	}
	tc := c.(*net.TCPConn)
	defer tc.Close()
	if err := fd.reply(id, agentproto.ForwardOK, ""); err != nil {
		st.Close()
		return
	}
	var both sync.WaitGroup
	both.Add(1)
	go func() { // the host's bytes; their end is the server's EOF (a FIN), a reset closes the connection
		defer both.Done()
		if _, err := io.Copy(tc, st); err != nil {
			tc.Close()
			return
		}
		_ = tc.CloseWrite()
	}()
	// The server's bytes; their end is the host's EOF. Copying from a TCPConn to the stream uses the stream's
	// Write in chunks within the host's credit: a slow host reader stops this connection only.
	_, err = io.Copy(st, tc)
	if err == nil {
		_ = st.CloseWrite()
	} else {
		st.Close()
	}
	both.Wait()
	st.Close()
}
