package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/coder/websocket"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/wire"
)

// WindowSize is a terminal's size in character cells.
type WindowSize = wire.WindowSize

// TTY is the terminal side of ExecTTY. Input is the terminal's input (a 0x03 byte is Ctrl-C: it interrupts the
// command's foreground process); nil sends none. Output receives the terminal's output, stdout and stderr
// together (nil discards). Size is the starting size (zero: 24x80); each value on Resize changes it.
type TTY struct {
	Input  io.Reader
	Output io.Writer
	Size   WindowSize
	Resize <-chan WindowSize
}

// maxTTYMessage bounds one message read from the server (an output chunk or the final result).
const maxTTYMessage = 4 << 20

// ExecTTY runs one command on a pseudo-terminal in the user's sandbox, over the server's WebSocket route. req's
// Stdin must be empty (the input is tty.Input). The result has empty Stdout and Stderr: the output went to
// tty.Output. Deadline, tree kill and exit status are as for Exec; cancelling ctx closes the WebSocket, and the
// server kills the command's tree.
//
// Goroutines: one copies tty.Input and may stay blocked in its Read after ExecTTY returns (an io.Reader cannot be
// interrupted); when that Read returns, it exits without writing.
func (c *Client) ExecTTY(ctx context.Context, user string, req ExecRequest, tty TTY) (*ExecResult, error) {
	if req.Stdin != "" {
		return nil, fault.New(fault.InvalidArgument, "pass the input as TTY.Input", "ExecTTY takes no ExecRequest.Stdin")
	}
	start := wire.TTYStart{ExecRequest: req.toWire()}
	if tty.Size != (WindowSize{}) {
		start.TTY = &tty.Size
	}
	first, err := json.Marshal(start)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hdr := http.Header{}
	if req.RequestID != "" {
		hdr.Set("X-Request-Id", req.RequestID)
	}
	ws, err := c.dialWS(ctx, "/v1/sandboxes/"+escape(user)+"/exec/tty", hdr)
	if err != nil {
		return nil, err
	}
	defer ws.CloseNow()
	ws.SetReadLimit(maxTTYMessage)
	if err := ws.Write(ctx, websocket.MessageText, first); err != nil {
		return nil, fmt.Errorf("client: exec tty: %w", err)
	}

	var wg sync.WaitGroup // the resize pump; the input pump is not waited for (see the doc comment)
	defer wg.Wait()
	defer cancel()
	if tty.Resize != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case ws2 := <-tty.Resize:
					msg, _ := json.Marshal(wire.TTYControl{Resize: &ws2})
					if ws.Write(ctx, websocket.MessageText, msg) != nil {
						return
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	if tty.Input != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := tty.Input.Read(buf)
				if n > 0 && ws.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
					return
				}
				if err != nil {
					return // the terminal's input ended; the command keeps its terminal until it exits
				}
			}
		}()
	}
	out := tty.Output
	if out == nil {
		out = io.Discard
	}
	for {
		typ, msg, err := ws.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("client: exec tty: the connection ended before the result: %w", err)
		}
		if typ == websocket.MessageBinary {
			if _, err := out.Write(msg); err != nil {
				return nil, fmt.Errorf("client: exec tty: output: %w", err) // leaving cancels the command
			}
			continue
		}
		var final wire.TTYFinal
		if err := json.Unmarshal(msg, &final); err != nil {
			return nil, fmt.Errorf("client: exec tty: final message: %w", err)
		}
		ws.Close(websocket.StatusNormalClosure, "")
		switch {
		case final.Error != nil:
			return nil, &APIError{Status: http.StatusOK, Err: faultOf(*final.Error)}
		case final.Result != nil:
			return final.Result, nil
		}
		return nil, errors.New("client: exec tty: a final message with neither result nor error")
	}
}

// DialPort opens one TCP connection to 127.0.0.1:port inside the user's running sandbox, through the server
// (port forwarding over a WebSocket). A refusal is an *APIError: PORT_UNREACHABLE when nothing listens there,
// SANDBOX_NOT_RUNNING, SANDBOX_NOT_FOUND. The connection ends when either side closes it or the sandbox stops;
// ctx bounds the dial only.
func (c *Client) DialPort(ctx context.Context, user string, port int) (net.Conn, error) {
	ws, err := c.dialWS(ctx, "/v1/sandboxes/"+escape(user)+"/ports/"+strconv.Itoa(port), nil)
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(-1) // a byte stream: messages are as large as the server's writes
	return websocket.NetConn(context.WithoutCancel(ctx), ws, websocket.MessageBinary), nil
}

// dialWS upgrades a GET of path to a WebSocket with the token; a refusal is the server's *APIError.
func (c *Client) dialWS(ctx context.Context, path string, hdr http.Header) (*websocket.Conn, error) {
	u := *c.base
	u.RawPath = c.base.EscapedPath() + path
	p, err := url.PathUnescape(u.RawPath)
	if err != nil {
		return nil, fmt.Errorf("client: path %q: %w", path, err)
	}
	u.Path = p
	if hdr == nil {
		hdr = http.Header{}
	}
	hdr.Set("Authorization", "Bearer "+c.token)
	hdr.Set("User-Agent", c.userAgent)
	ws, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: hdr})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, apiError(resp)
		}
		return nil, err
	}
	return ws, nil
}

// ForwardPort is one of the repository's devcontainer.json forwardPorts and what port forwarding does with it
// (the library's sandkeep.ForwardPort): a Forwarded one is reached with DialPort(ctx, user, Port).
type ForwardPort = wire.ForwardPort

// ForwardPorts lists the forwardPorts of the repository user's runs follow, in the file's order (scope read);
// empty when it has none. Nothing is connected to.
func (c *Client) ForwardPorts(ctx context.Context, user string) ([]ForwardPort, error) {
	var out wire.ForwardPortList
	err := c.call(ctx, "GET", "/v1/sandboxes/"+escape(user)+"/ports", nil, nil, nil, &out)
	return out.Ports, err
}
