package agentproto

import (
	"bytes"
	"context"
	"io"
	"testing"
	"unicode/utf8"
)

// FuzzReadFrame: arbitrary bytes never panic ReadFrame, every frame it returns is within its type's bound, and
// re-encoding the frames reproduces exactly the bytes consumed.
func FuzzReadFrame(f *testing.F) {
	f.Add(frame(FrameStdout, 1, []byte("hello")))
	f.Add(append(frame(FrameCancel, 2, nil), frame(FrameRequest, 2, []byte(`{"v":1}`))...))
	f.Add(header(FrameStdout, 1, 0xffffffff))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		var buf, again []byte
		for {
			before := r.Len()
			fr, err := ReadFrame(r, &buf)
			if err != nil {
				return
			}
			limit, ok := maxPayload(fr.Type)
			if !ok || len(fr.Payload) > limit {
				t.Fatalf("frame %v with %d bytes accepted", fr.Type, len(fr.Payload))
			}
			again = appendFrame(again[:0], fr.Type, fr.ID, fr.Payload)
			consumed := data[len(data)-before : len(data)-r.Len()]
			if !bytes.Equal(again, consumed) {
				t.Fatalf("re-encoded %x, read %x", again, consumed)
			}
		}
	})
}

// FuzzRun feeds arbitrary agent bytes to Run: it never panics, never writes more than the limits, and returns a
// Result without error only when the bytes are a valid answer (output frames for the command, then a valid
// Result).
func FuzzRun(f *testing.F) {
	f.Add(append(frame(FrameStdout, 7, []byte("hi")), resultFrame(f, Result{ID: 7, ExitCode: 1})...))
	f.Add(append(frame(FrameStderr, 7, []byte("€€€€")), resultFrame(f, Result{ID: 7, ExitCode: 143, Signal: 15})...))
	f.Add(resultFrame(f, Result{ID: 8}))
	f.Add(frame(FrameResult, 7, []byte(`{"id":7,"exit_code":256}`)))
	f.Add(header(FrameStdout, 7, MaxFrame+1))
	f.Fuzz(func(t *testing.T, data []byte) {
		req := testRequest(7)
		req.StdoutLimit, req.StderrLimit = 16, 16
		conn := struct {
			io.Reader
			io.Writer
		}{bytes.NewReader(data), io.Discard}
		var out, errb bytes.Buffer
		res, err := Run(context.Background(), conn, req, &out, &errb, nil)
		if int64(out.Len()) > req.StdoutLimit || int64(errb.Len()) > req.StderrLimit {
			t.Fatalf("wrote %d/%d bytes over limits", out.Len(), errb.Len())
		}
		if err != nil {
			if res != (Result{}) {
				t.Fatalf("result %+v with error %v", res, err)
			}
			return
		}
		if !validAnswer(data, 7) {
			t.Fatalf("invalid agent bytes accepted: %+v", res)
		}
		if res.ExitCode < 0 || res.ExitCode > 255 || res.ID != 7 {
			t.Fatalf("bad result accepted: %+v", res)
		}
		if !utf8.Valid(out.Bytes()) && utf8.Valid(concatOutput(data, FrameStdout)) {
			t.Fatalf("valid output became invalid: %q", out.Bytes())
		}
	})
}

// validAnswer is an independent statement of what Run must accept: frames of the command id, only output
// frames, then a Result whose fields are in range.
func validAnswer(data []byte, id uint32) bool {
	r := bytes.NewReader(data)
	var buf []byte
	for {
		f, err := ReadFrame(r, &buf)
		if err != nil || f.ID != id {
			return false
		}
		switch f.Type {
		case FrameStdout, FrameStderr:
		case FrameResult:
			_, err := DecodeResult(f.Payload, id)
			return err == nil
		default:
			return false
		}
	}
}

// concatOutput joins the payloads of the frames of one type, up to the first bad frame.
func concatOutput(data []byte, t FrameType) []byte {
	r := bytes.NewReader(data)
	var buf, out []byte
	for {
		f, err := ReadFrame(r, &buf)
		if err != nil {
			return out
		}
		if f.Type == t {
			out = append(out, f.Payload...)
		}
	}
}

// FuzzDecodeWindowSize: a resize payload decodes only when it is 4 bytes of a size in bounds, and re-encodes to
// the same bytes.
func FuzzDecodeWindowSize(f *testing.F) {
	f.Add(EncodeWindowSize(WindowSize{Rows: 24, Cols: 80}))
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0, 1, 2})
	f.Fuzz(func(t *testing.T, p []byte) {
		ws, err := DecodeWindowSize(p)
		if err != nil {
			return
		}
		if ws.Check() != nil || !bytes.Equal(EncodeWindowSize(ws), p) {
			t.Fatalf("accepted %x as %+v", p, ws)
		}
	})
}
