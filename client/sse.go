package client

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
)

// maxSSELine bounds one line of an event stream: an event's JSON is small, and a server that sends more is
// not sending events.
const maxSSELine = 1 << 20

// readSSE reads a text/event-stream from r and calls fn with each message's event name and data. fn returns
// done to stop. A stream that ends before done is an error wrapping io.ErrUnexpectedEOF.
func readSSE(r io.Reader, fn func(event string, data []byte) (done bool, err error)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxSSELine)
	var event string
	var data bytes.Buffer
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 { // a blank line ends a message
			if event != "" || data.Len() > 0 {
				if event == "" {
					event = "message"
				}
				done, err := fn(event, data.Bytes())
				if err != nil || done {
					return err
				}
			}
			event = ""
			data.Reset()
			continue
		}
		if line[0] == ':' { // a comment: the server's keepalive
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			event = string(value)
		case "data":
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.Write(value)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("client: read the event stream: %w", err)
	}
	return fmt.Errorf("client: the event stream ended before the run did: %w", io.ErrUnexpectedEOF)
}
