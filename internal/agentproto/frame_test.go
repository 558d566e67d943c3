package agentproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

func header(t FrameType, id, n uint32) []byte {
	b := []byte{byte(t)}
	b = binary.BigEndian.AppendUint32(b, id)
	return binary.BigEndian.AppendUint32(b, n)
}

func TestFrameRoundTrip(t *testing.T) {
	var stream bytes.Buffer
	frames := []Frame{
		{FrameRequest, 1, bytes.Repeat([]byte{'q'}, MaxRequest)},
		{FrameStdin, 2, []byte("in")},
		{FrameStdinEOF, 3, nil},
		{FrameCancel, 4, nil},
		{FrameStdout, 5, bytes.Repeat([]byte{'o'}, MaxFrame)},
		{FrameStderr, 6, []byte{}},
		{FrameResult, 0xffffffff, []byte(`{}`)},
	}
	for _, f := range frames {
		if err := WriteFrame(&stream, f.Type, f.ID, f.Payload); err != nil {
			t.Fatalf("write %v: %v", f.Type, err)
		}
	}
	var buf []byte
	for _, want := range frames {
		got, err := ReadFrame(&stream, &buf)
		if err != nil {
			t.Fatalf("read %v: %v", want.Type, err)
		}
		if got.Type != want.Type || got.ID != want.ID || !bytes.Equal(got.Payload, want.Payload) {
			t.Fatalf("got %v/%d/%d bytes, want %v/%d/%d bytes", got.Type, got.ID, len(got.Payload), want.Type, want.ID, len(want.Payload))
		}
	}
	if _, err := ReadFrame(&stream, &buf); err != io.EOF {
		t.Fatalf("at end of stream: %v, want io.EOF", err)
	}
}

// countingReader serves b and counts how much was read from it.
type countingReader struct {
	b []byte
	n int
}

func (r *countingReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b, r.n = r.b[n:], r.n+n
	return n, nil
}

func TestReadFrameRejects(t *testing.T) {
	tests := []struct {
		name  string
		input []byte
		cut   bool // also io.ErrUnexpectedEOF
	}{
		{"unknown type", header('X', 1, 0), false},
		{"zero type", header(0, 1, 0), false},
		{"oversized output", header(FrameStdout, 1, MaxFrame+1), false},
		{"oversized result", header(FrameResult, 1, MaxFrame+1), false},
		{"oversized request", header(FrameRequest, 1, MaxRequest+1), false},
		{"huge length", header(FrameStdout, 1, 0xffffffff), false},
		{"payload on cancel", header(FrameCancel, 1, 1), false},
		{"payload on stdin EOF", header(FrameStdinEOF, 1, 1), false},
		{"cut header", header(FrameStdout, 1, 0)[:5], true},
		{"cut payload", append(header(FrameStdout, 1, 10), "abc"...), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &countingReader{b: tt.input}
			var buf []byte
			_, err := ReadFrame(r, &buf)
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", err)
			}
			if got := errors.Is(err, io.ErrUnexpectedEOF); got != tt.cut {
				t.Fatalf("io.ErrUnexpectedEOF = %v, want %v (%v)", got, tt.cut, err)
			}
			if !tt.cut && (r.n != HeaderSize || cap(buf) != 0) {
				t.Fatalf("read %d bytes and allocated %d after a bad header", r.n, cap(buf))
			}
		})
	}
}

func TestWriteFrameRejects(t *testing.T) {
	var w bytes.Buffer
	for _, err := range []error{
		WriteFrame(&w, 'X', 1, nil),
		WriteFrame(&w, FrameStdout, 1, make([]byte, MaxFrame+1)),
		WriteFrame(&w, FrameCancel, 1, []byte{1}),
		NewFrameWriter(&w).WriteFrame(FrameResult, 1, make([]byte, MaxFrame+1)),
	} {
		if !errors.Is(err, ErrProtocol) {
			t.Errorf("err = %v, want ErrProtocol", err)
		}
	}
	if w.Len() != 0 {
		t.Fatalf("%d bytes written for refused frames", w.Len())
	}
}

func TestReadFrameReusesBuffer(t *testing.T) {
	var stream bytes.Buffer
	for range 100 {
		_ = WriteFrame(&stream, FrameStdout, 1, make([]byte, 1000))
	}
	var buf []byte
	if _, err := ReadFrame(&stream, &buf); err != nil {
		t.Fatal(err)
	}
	first := &buf[0]
	for range 99 {
		f, err := ReadFrame(&stream, &buf)
		if err != nil {
			t.Fatal(err)
		}
		if &f.Payload[0] != first {
			t.Fatal("payload buffer was not reused")
		}
	}
}
