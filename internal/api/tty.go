package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"

	"github.com/coder/websocket"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/wire"
)

// The WebSocket routes. Authentication is the upgrade request's Authorization header, as for every route: a
// refused token, scope or request answers a plain JSON error before any upgrade.
//
// GET /v1/sandboxes/{user}/exec/tty runs one command on a pseudo-terminal. The client's first message is a text
// message holding an ExecBody (stdin refused: it comes as messages), with "tty": {"rows", "cols"} (default
// 24x80). Then binary messages from the client are the terminal's input (a 0x03 byte is Ctrl-C) and text
// messages are controls, {"resize": {"rows", "cols"}}; binary messages from the server are the terminal's
// output, and its last message is a text one, {"result": {...}} (the exec answer) or {"error": {...}}, before
// a normal close. A client that goes away cancels the command (its tree is killed).
//
// GET /v1/sandboxes/{user}/ports/{port} is one forwarded TCP connection to 127.0.0.1:port inside the user's
// running sandbox: the server connects first (a failure is a plain error answer: 502 PORT_UNREACHABLE, 409
// SANDBOX_NOT_RUNNING, ...), then upgrades; binary messages carry the bytes both ways, and either side's close
// ends the connection.

// TTYControl is a text message of the client after the first: a window size change.
type TTYControl = wire.TTYControl

// TTYFinal is the server's last message on a TTY exec: exactly one of Result and Error.
type TTYFinal = wire.TTYFinal

func (s *Server) handleExecTTY(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{WSProtocol}})
	if err != nil {
		return // Accept answered the client
	}
	defer c.CloseNow()
	c.SetReadLimit(s.maxBody)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	id := infoOf(r).id
	fail := func(err error) {
		fe, _ := s.classify(r, err)
		s.sendFinal(ctx, c, TTYFinal{Error: new(wireError(fe))})
	}

	typ, first, err := c.Read(ctx)
	if err != nil {
		return
	}
	if typ != websocket.MessageText {
		fail(invalid("send the exec request as a JSON text message first", "the first message is binary"))
		return
	}
	req, ar, err := decodeExecTTY(first)
	if err != nil {
		fail(err)
		return
	}
	ar.RequestID = id
	stdinR, stdinW := io.Pipe()
	resize := make(chan sandkeep.WindowSize, 1)
	req.Stdin, req.TTY.Resize = stdinR, resize
	req.Stdout = writerFunc(func(p []byte) (int, error) {
		// A client that went away is not the command's problem: its output is dropped, and the reader's
		// failure (below) cancels the command.
		_ = c.Write(ctx, websocket.MessageBinary, p)
		return len(p), nil
	})

	var wg sync.WaitGroup // the reader of the client's messages
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer stdinW.Close()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				cancel() // the client is gone, or closed: the command's tree is killed
				return
			}
			if typ == websocket.MessageBinary {
				if _, err := stdinW.Write(msg); err != nil {
					continue // the command no longer reads; keep serving resizes until it ends
				}
				continue
			}
			var ctl TTYControl
			if json.Unmarshal(msg, &ctl) != nil || ctl.Resize == nil {
				continue // an unknown control is ignored, as a terminal ignores an unknown sequence
			}
			select { // the newest size wins
			case <-resize:
			default:
			}
			resize <- sandkeep.WindowSize(*ctl.Resize)
		}
	}()

	res, err := s.backend.Exec(ctx, key, ar, req)
	stdinR.Close() // unblocks the reader's write to a command that is over
	switch {
	case err != nil && ctx.Err() != nil:
		infoOf(r).clientGone = true
	case err != nil:
		fail(err)
	default:
		s.sendFinal(ctx, c, TTYFinal{Result: new(execResponse(res, id))})
	}
	c.Close(websocket.StatusNormalClosure, "")
	cancel()
	wg.Wait()
}

func (s *Server) sendFinal(ctx context.Context, c *websocket.Conn, f TTYFinal) {
	b, err := json.Marshal(f)
	if err != nil {
		b = []byte(`{"error":{"code":"INTERNAL","message":"the server failed to encode the result","hint":""}}`)
	}
	_ = c.Write(ctx, websocket.MessageText, b)
}

// ExecTTYBody is the first message of a TTY exec: an exec request and the terminal's size.
type ExecTTYBody = wire.TTYStart

func decodeExecTTY(data []byte) (sandkeep.ExecRequest, service.AdmitRequest, error) {
	var b ExecTTYBody
	if err := strictJSON(data, &b); err != nil {
		return sandkeep.ExecRequest{}, service.AdmitRequest{}, err
	}
	if b.Stdin != nil {
		return sandkeep.ExecRequest{}, service.AdmitRequest{}, invalid("leave stdin out and send the input as binary messages",
			"a TTY exec takes its input from the WebSocket")
	}
	req, ar, err := execRequest(b.ExecRequest)
	if err != nil {
		return req, ar, err
	}
	size := sandkeep.WindowSize{Rows: 24, Cols: 80}
	if b.TTY != nil {
		size = sandkeep.WindowSize(*b.TTY)
	}
	req.TTY = &sandkeep.TTY{Size: size} // its bounds are the engine's to check, with the rest of the command
	return req, ar, nil
}

func (s *Server) handlePortForward(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		s.writeError(w, r, invalid("use a TCP port between 1 and 65535", "port %q is out of range", r.PathValue("port")))
		return
	}
	pd, ok := s.backend.(service.PortDialer)
	if !ok {
		s.writeError(w, r, errNoPortForward())
		return
	}
	conn, err := pd.DialPort(r.Context(), key, port, sandkeep.PortForward{Via: "api", RequestID: infoOf(r).id})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer conn.Close()
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{WSProtocol}})
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ws := websocket.NetConn(ctx, c, websocket.MessageBinary)
	spliceClose(ws, conn)
}

// ForwardPortList answers GET /v1/sandboxes/{user}/ports: the forwardPorts of the repository the user's runs
// follow (devcontainer.json), each with what port forwarding does with it; a client forwards each forwarded one
// with GET /v1/sandboxes/{user}/ports/{port}.
type ForwardPortList = wire.ForwardPortList

func (s *Server) handleForwardPorts(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	fl, ok := s.backend.(service.ForwardPortLister)
	if !ok {
		s.writeError(w, r, errNoPortForward())
		return
	}
	ports, err := fl.ForwardPorts(r.Context(), key)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if ports == nil {
		ports = []sandkeep.ForwardPort{}
	}
	writeJSON(w, http.StatusOK, ForwardPortList{Ports: wirePorts(ports)})
}

// ForwardPorts lists the repository's forwardPorts; a Backend without them cannot forward ports.
func (g *guarded) ForwardPorts(ctx context.Context, key sandkeep.Key) ([]sandkeep.ForwardPort, error) {
	fl, ok := g.Backend.(service.ForwardPortLister)
	if !ok {
		return nil, errNoPortForward()
	}
	return fl.ForwardPorts(ctx, key)
}

// errNoPortForward is the answer of a server whose backend cannot forward ports.
func errNoPortForward() error {
	return fault.New(fault.PortForwardUnavailable, "use a server over the docker driver", "this server cannot forward ports")
}

// spliceClose copies both ways until either direction ends, then closes both: a WebSocket has no half-close.
func spliceClose(a, b net.Conn) {
	var once sync.Once
	closeBoth := func() { once.Do(func() { a.Close(); b.Close() }) }
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(b, a)
		closeBoth()
	}()
	_, _ = io.Copy(a, b)
	closeBoth()
	wg.Wait()
}

// DialPort refuses new forwards while draining; an open one is not waited for (it may last as long as its
// server).
func (g *guarded) DialPort(ctx context.Context, key sandkeep.Key, port int, pf sandkeep.PortForward) (net.Conn, error) {
	if !g.s.drain.enter() {
		return nil, errShuttingDown()
	}
	defer g.s.drain.leave()
	pd, ok := g.Backend.(service.PortDialer)
	if !ok {
		return nil, errNoPortForward()
	}
	return pd.DialPort(ctx, key, port, pf)
}

// strictJSON decodes exactly one JSON object with no unknown field into v.
func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalid("send exactly one JSON object", "the message has data after its JSON object")
	}
	return nil
}
