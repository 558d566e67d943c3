package agentproto

import (
	"sync"
	"sync/atomic"
)

// routes are the command IDs whose frames the Mux hands to a Conn of their own: commands that run beside others
// (Request.Concurrent), process starts and process operations. Every other command frame goes to Commands.
type routes struct {
	n    atomic.Int32 // len(m)+len(done), read without the lock by the reader's watch
	mu   sync.Mutex
	m    map[uint32]*muxCommands
	done map[uint32]struct{} // closed routes whose late frames are dropped, not handed to Commands
	fifo []uint32            // done's IDs, oldest first; at most maxDoneRoutes
}

// maxDoneRoutes bounds the closed routes remembered: a frame for one of them still on its way (the reply to a
// cancelled attach) is dropped rather than taken for a frame of the command on Commands.
const maxDoneRoutes = 1024

func (r *routes) count() int { return int(r.n.Load()) }

// lookup returns id's route and true, or nil and true for a closed route, or false for an ID never routed.
func (r *routes) lookup(id uint32) (*muxCommands, bool) {
	if r.count() == 0 {
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.m[id]; ok {
		return c, true
	}
	_, done := r.done[id]
	return nil, done
}

func (r *routes) has(id uint32) bool { _, ok := r.lookup(id); return ok }

// RouteConn is a Conn for one command or operation ID on a Mux. Close it when done with the ID: its frames then
// go to Commands again (where a late one is a protocol error for the command that reads them) and a Read
// blocked in it returns io.EOF.
type RouteConn struct {
	*muxCommands
	id   uint32
	once sync.Once
}

// Route returns a Conn that gets the channel's frames for id, and only those, while other commands and
// operations run on the same channel. Its frames have the same bound as Commands' (commandQueue): a reader that
// falls behind holds up the channel. id must not be in use by another route.
func (m *Mux) Route(id uint32) *RouteConn {
	c := &muxCommands{m: m, frames: make(chan queued, commandQueue), wake: make(chan struct{}), gone: make(chan struct{})}
	m.routes.mu.Lock()
	if m.routes.m == nil {
		m.routes.m = map[uint32]*muxCommands{}
	}
	m.routes.m[id] = c
	m.routes.n.Store(int32(len(m.routes.m) + len(m.routes.done)))
	m.routes.mu.Unlock()
	return &RouteConn{muxCommands: c, id: id}
}

// Close drops the route.
func (c *RouteConn) Close() error {
	c.once.Do(func() {
		r := &c.m.routes
		r.mu.Lock()
		if r.m[c.id] == c.muxCommands {
			delete(r.m, c.id)
			if r.done == nil {
				r.done = map[uint32]struct{}{}
			}
			r.done[c.id] = struct{}{}
			r.fifo = append(r.fifo, c.id)
			if len(r.fifo) > maxDoneRoutes {
				delete(r.done, r.fifo[0])
				r.fifo = r.fifo[1:]
			}
		}
		r.n.Store(int32(len(r.m) + len(r.done)))
		r.mu.Unlock()
		close(c.gone) // a reader blocked on this route's full queue goes on (push drops the frame)
	})
	return nil
}
