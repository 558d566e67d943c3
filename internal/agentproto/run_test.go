package agentproto

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func testRequest(id uint32) Request {
	return Request{
		Version: Version, ID: id, Argv: []string{"true"}, TimeoutMS: 10_000, GraceMS: 100,
		StdoutLimit: DefaultLimit, StderrLimit: DefaultLimit,
	}
}

func resultFrame(t testing.TB, res Result) []byte {
	t.Helper()
	body, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	return frame(FrameResult, res.ID, body)
}

// frame encodes one frame, or an invalid one: it does not check anything.
func frame(typ FrameType, id uint32, payload []byte) []byte {
	return appendFrame(nil, typ, id, payload)
}

// fakeResult is what runFake returns.
type fakeResult struct {
	res            Result
	err            error
	stdout, stderr string
}

// runFake runs Run against a fake agent on the other end of a net.Pipe. agent gets the decoded request.
func runFake(t *testing.T, ctx context.Context, req Request, stdin io.Reader, agent func(c net.Conn, req Request)) fakeResult {
	t.Helper()
	return runFakeWith(t, ctx, req, stdin, RunOptions{}, agent)
}

// runFakeWith is runFake with RunOptions.
func runFakeWith(t *testing.T, ctx context.Context, req Request, stdin io.Reader, opts RunOptions, agent func(c net.Conn, req Request)) fakeResult {
	t.Helper()
	host, ag := net.Pipe()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer ag.Close()
		var buf []byte
		f, err := ReadFrame(ag, &buf)
		if err != nil || f.Type != FrameRequest {
			t.Errorf("fake agent: first frame %v, %v", f.Type, err)
			return
		}
		var got Request
		if err := json.Unmarshal(f.Payload, &got); err != nil {
			t.Errorf("fake agent: %v", err)
			return
		}
		agent(ag, got)
	}()
	var out, errb bytes.Buffer
	res, err := RunWith(ctx, host, req, &out, &errb, stdin, opts)
	host.Close()
	wg.Wait()
	return fakeResult{res, err, out.String(), errb.String()}
}

// drainFrames reads the host's frames until the stream ends, calling on for each.
func drainFrames(c net.Conn, on func(Frame)) {
	var buf []byte
	for {
		f, err := ReadFrame(c, &buf)
		if err != nil {
			return
		}
		if on != nil {
			on(f)
		}
	}
}

func TestRunStreamsAndReports(t *testing.T) {
	got := runFake(t, t.Context(), testRequest(7), nil, func(c net.Conn, req Request) {
		c.Write(frame(FrameStdout, 7, []byte("hello ")))
		c.Write(frame(FrameStderr, 7, []byte("oops")))
		c.Write(frame(FrameStdout, 7, []byte("world")))
		c.Write(resultFrame(t, Result{ID: 7, ExitCode: 3, DurationMS: 12}))
	})
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.res.ExitCode != 3 || got.res.DurationMS != 12 || got.stdout != "hello world" || got.stderr != "oops" {
		t.Fatalf("got %+v", got)
	}
}

func TestRunReboundsOutput(t *testing.T) {
	req := testRequest(1)
	req.StdoutLimit, req.StderrLimit = 10, 5
	got := runFake(t, t.Context(), req, nil, func(c net.Conn, req Request) {
		for range 3 {
			c.Write(frame(FrameStdout, 1, []byte("12345678")))
		}
		c.Write(frame(FrameStderr, 1, []byte("abc€"))) // the cut falls inside €
		c.Write(resultFrame(t, Result{ID: 1}))         // the agent claims nothing was cut
	})
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.stdout != "1234567812" || !got.res.StdoutTruncated {
		t.Fatalf("stdout %q truncated=%v", got.stdout, got.res.StdoutTruncated)
	}
	if got.stderr != "abc" || !got.res.StderrTruncated {
		t.Fatalf("stderr %q truncated=%v", got.stderr, got.res.StderrTruncated)
	}
}

func TestRunKeepsAgentTruncationFlag(t *testing.T) {
	got := runFake(t, t.Context(), testRequest(1), nil, func(c net.Conn, req Request) {
		c.Write(resultFrame(t, Result{ID: 1, StdoutTruncated: true}))
	})
	if got.err != nil || !got.res.StdoutTruncated || got.res.StderrTruncated {
		t.Fatalf("got %+v", got)
	}
}

func TestRunProtocolViolations(t *testing.T) {
	tests := []struct {
		name  string
		agent []byte // sent after the request was read; then the agent closes the stream
		cut   bool   // the error also wraps io.ErrUnexpectedEOF
	}{
		{"EOF before result", nil, true},
		{"EOF after output", frame(FrameStdout, 1, []byte("x")), true},
		{"cut frame", frame(FrameStdout, 1, []byte("xyz"))[:HeaderSize+1], true},
		{"wrong id", frame(FrameStdout, 2, []byte("x")), false},
		{"wrong id on result", resultFrame(t, Result{ID: 2}), false},
		{"id mismatch inside result", frame(FrameResult, 1, []byte(`{"id":2}`)), false},
		{"oversized frame", header(FrameStdout, 1, MaxFrame+1), false},
		{"unknown type", header('Z', 1, 0), false},
		{"host frame type", frame(FrameCancel, 1, nil), false},
		{"request frame type", frame(FrameRequest, 1, []byte(`{}`)), false},
		{"bad json", frame(FrameResult, 1, []byte(`{"id":1,`)), false},
		{"trailing garbage", frame(FrameResult, 1, []byte(`{"id":1} x`)), false},
		{"exit 999", resultFrame(t, Result{ID: 1, ExitCode: 999}), false},
		{"exit -1", resultFrame(t, Result{ID: 1, ExitCode: -1}), false},
		{"signal without its exit code", resultFrame(t, Result{ID: 1, ExitCode: 0, Signal: 9}), false},
		{"negative duration", resultFrame(t, Result{ID: 1, DurationMS: -1}), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := runFake(t, t.Context(), testRequest(1), nil, func(c net.Conn, req Request) {
				c.Write(tt.agent)
			})
			if !errors.Is(got.err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", got.err)
			}
			if errors.Is(got.err, io.ErrUnexpectedEOF) != tt.cut {
				t.Fatalf("err = %v, want io.ErrUnexpectedEOF %v", got.err, tt.cut)
			}
			if got.res != (Result{}) {
				t.Fatalf("a result came with a protocol error: %+v", got.res)
			}
		})
	}
}

func TestRunCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cause := errors.New("user pressed stop")
		ctx, cancel := context.WithCancelCause(t.Context())
		got := runFake(t, ctx, testRequest(4), nil, func(c net.Conn, req Request) {
			c.Write(frame(FrameStdout, 4, []byte("started")))
			cancel(cause)
			drainFrames(c, func(f Frame) {
				if f.Type == FrameCancel && f.ID == 4 {
					c.Write(resultFrame(t, Result{ID: 4, ExitCode: 143, Signal: 15, Cancelled: true}))
				}
			})
		})
		if !errors.Is(got.err, cause) || errors.Is(got.err, ErrProtocol) {
			t.Fatalf("err = %v, want the cause", got.err)
		}
		if !got.res.Cancelled || got.res.ExitCode != 143 || got.stdout != "started" {
			t.Fatalf("got %+v", got)
		}
	})
}

func TestRunAgentDoesNotStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		req := testRequest(4)
		var start time.Time
		got := runFake(t, ctx, req, nil, func(c net.Conn, _ Request) {
			start = time.Now()
			cancel()
			drainFrames(c, nil) // reads the cancel and ignores it
		})
		if !errors.Is(got.err, ErrProtocol) || !errors.Is(got.err, context.Canceled) {
			t.Fatalf("err = %v, want ErrProtocol and context.Canceled", got.err)
		}
		if waited := time.Since(start); waited != req.Grace()+ReportSlack {
			t.Fatalf("gave up after %v, want %v", waited, req.Grace()+ReportSlack)
		}
	})
}

func TestRunBackstop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		req := testRequest(4)
		req.TimeoutMS = 1000
		var start time.Time
		var cancels atomic.Int32
		got := runFake(t, t.Context(), req, nil, func(c net.Conn, _ Request) {
			start = time.Now()
			drainFrames(c, func(f Frame) {
				if f.Type == FrameCancel {
					cancels.Add(1)
				}
			})
		})
		if !errors.Is(got.err, ErrProtocol) {
			t.Fatalf("err = %v, want ErrProtocol", got.err)
		}
		if want := req.Timeout() + req.Grace() + ReportSlack; time.Since(start) != want {
			t.Fatalf("gave up after %v, want %v", time.Since(start), want)
		}
		if cancels.Load() > 1 {
			t.Fatalf("%d cancel frames", cancels.Load())
		}
	})
}

// TestRunSilentAgentWithoutDeadlines checks that Run still returns in time on a conn that cannot be unblocked.
func TestRunSilentAgentWithoutDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pr, pw := io.Pipe()
		req := testRequest(4)
		req.TimeoutMS = 1000
		res, err := Run(t.Context(), struct {
			io.Reader
			io.Writer
		}{pr, io.Discard}, req, nil, nil, nil)
		if !errors.Is(err, ErrProtocol) || res != (Result{}) {
			t.Fatalf("got %+v, %v", res, err)
		}
		pw.Close() // releases the reader Run had to leave behind, as the doc comment says the caller does
	})
}

func TestRunStdin(t *testing.T) {
	input := strings.Repeat("0123456789abcdef", 10_000) // several 'I' frames
	req := testRequest(9)
	req.Stdin = true
	got := runFake(t, t.Context(), req, strings.NewReader(input), func(c net.Conn, req Request) {
		var buf []byte
		for {
			f, err := ReadFrame(c, &buf)
			if err != nil {
				t.Errorf("fake agent: %v", err)
				return
			}
			if f.ID != 9 {
				t.Errorf("stdin frame for %d", f.ID)
			}
			switch f.Type {
			case FrameStdin:
				c.Write(frame(FrameStdout, 9, f.Payload)) // echo
			case FrameStdinEOF:
				c.Write(resultFrame(t, Result{ID: 9}))
				return
			default:
				t.Errorf("unexpected %v", f.Type)
			}
		}
	})
	if got.err != nil || got.stdout != input {
		t.Fatalf("err %v, echoed %d of %d bytes", got.err, len(got.stdout), len(input))
	}
}

// gatedReader blocks its first Read until gate is closed.
type gatedReader struct {
	gate   chan struct{}
	called chan struct{}
}

func (r *gatedReader) Read(p []byte) (int, error) {
	close(r.called)
	<-r.gate
	return copy(p, "late"), nil
}

// recordingConn serves fixed agent bytes and fails the test on a write after Run returned.
type recordingConn struct {
	t        *testing.T
	r        io.Reader
	returned atomic.Bool
	writes   atomic.Int32
}

func (c *recordingConn) Read(p []byte) (int, error) { return c.r.Read(p) }
func (c *recordingConn) Write(p []byte) (int, error) {
	if c.returned.Load() {
		c.t.Errorf("frame %q written after Run returned", p[0])
	}
	c.writes.Add(1)
	return len(p), nil
}

func TestRunNoWriteAfterReturn(t *testing.T) {
	req := testRequest(3)
	req.Stdin = true
	stdin := &gatedReader{gate: make(chan struct{}), called: make(chan struct{})}
	pr, pw := io.Pipe()
	conn := &recordingConn{t: t, r: pr}
	go func() {
		<-stdin.called // the pump is in its Read: report now
		pw.Write(resultFrame(t, Result{ID: 3}))
	}()
	if _, err := Run(t.Context(), conn, req, nil, nil, stdin); err != nil {
		t.Fatal(err)
	}
	conn.returned.Store(true)
	close(stdin.gate) // the pump's Read returns data: it must not send it
	goleak.VerifyNone(t)
	if n := conn.writes.Load(); n != 1 {
		t.Fatalf("%d writes, want only the request", n)
	}
}

func TestRunRefusesBeforeSending(t *testing.T) {
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	bad := testRequest(1)
	bad.Argv = nil
	withStdin := testRequest(1)
	withStdin.Stdin = true
	tests := []struct {
		name string
		ctx  context.Context
		req  Request
		want error
	}{
		{"invalid request", t.Context(), bad, ErrBadRequest},
		{"stdin without reader", t.Context(), withStdin, ErrBadRequest},
		{"cancelled context", cancelled, testRequest(1), context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := &recordingConn{t: t, r: strings.NewReader("")}
			_, err := Run(tt.ctx, conn, tt.req, nil, nil, nil)
			if !errors.Is(err, tt.want) || conn.writes.Load() != 0 {
				t.Fatalf("err = %v with %d writes, want %v and none", err, conn.writes.Load(), tt.want)
			}
		})
	}
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

func TestRunStdoutWriteError(t *testing.T) {
	boom := errors.New("disk full")
	var agent bytes.Buffer
	agent.Write(frame(FrameStdout, 1, []byte("x")))
	agent.Write(frame(FrameStdout, 1, []byte("y")))
	agent.Write(resultFrame(t, Result{ID: 1, ExitCode: 5}))
	conn := struct {
		io.Reader
		io.Writer
	}{&agent, io.Discard}
	res, err := Run(t.Context(), conn, testRequest(1), failingWriter{boom}, nil, nil)
	if !errors.Is(err, boom) || errors.Is(err, ErrProtocol) || res.ExitCode != 5 {
		t.Fatalf("got %+v, %v", res, err)
	}
}

// TestRunFloodBoundedMemory has a hostile agent send far more output than the limit: the host keeps the
// limit's worth and allocates next to nothing for the rest.
func TestRunFloodBoundedMemory(t *testing.T) {
	const flood = 256 << 20
	req := testRequest(1)
	req.StdoutLimit = 1 << 20
	chunk := bytes.Repeat([]byte{'z'}, MaxFrame)
	result := resultFrame(t, Result{ID: 1})
	host, ag := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer ag.Close()
		var buf []byte
		if _, err := ReadFrame(ag, &buf); err != nil {
			t.Error(err)
			return
		}
		fw := NewFrameWriter(ag) // reuses its buffer: the agent side adds nothing to the count
		for range flood / MaxFrame {
			if err := fw.WriteFrame(FrameStdout, 1, chunk); err != nil {
				t.Error(err)
				return
			}
		}
		ag.Write(result)
	}()
	var out countWriter
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	res, err := Run(t.Context(), host, req, &out, nil, nil)
	runtime.ReadMemStats(&after)
	host.Close()
	<-done
	if err != nil || !res.StdoutTruncated || out.n != req.StdoutLimit {
		t.Fatalf("got %+v, %v, %d bytes", res, err, out.n)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Fatalf("host allocated %d MiB for a %d MiB flood", grew>>20, flood>>20)
	}
}

type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// TestRunAcceptWait: with AcceptWait, an agent that never acknowledges the request (a frozen sandbox) ends Run
// with ErrNotAccepted after that wait, long before the command's own bounds; an agent that acknowledges is
// then free to take as long as its deadline allows.
func TestRunAcceptWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		req := testRequest(7)
		req.TimeoutMS = 60_000
		var start time.Time
		got := runFakeWith(t, t.Context(), req, nil, RunOptions{AcceptWait: 2 * time.Second}, func(c net.Conn, _ Request) {
			start = time.Now()
			drainFrames(c, nil)
		})
		if !errors.Is(got.err, ErrNotAccepted) || !errors.Is(got.err, ErrProtocol) {
			t.Fatalf("err = %v, want ErrNotAccepted (an ErrProtocol)", got.err)
		}
		if waited := time.Since(start); waited != 2*time.Second {
			t.Fatalf("gave up after %v, want 2s", waited)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		req := testRequest(8)
		req.TimeoutMS = 60_000
		got := runFakeWith(t, t.Context(), req, nil, RunOptions{AcceptWait: time.Second}, func(c net.Conn, req Request) {
			c.Write(frame(FrameAccepted, req.ID, nil))
			time.Sleep(30 * time.Second) // slow, but accepted: fine
			c.Write(frame(FrameStdout, req.ID, []byte("late\n")))
			c.Write(resultFrame(t, Result{ID: req.ID}))
			drainFrames(c, nil)
		})
		if got.err != nil || got.stdout != "late\n" {
			t.Fatalf("got %+v", got)
		}
	})
}

func TestRunAcceptedTwice(t *testing.T) {
	got := runFake(t, t.Context(), testRequest(9), nil, func(c net.Conn, req Request) {
		c.Write(frame(FrameAccepted, req.ID, nil))
		c.Write(frame(FrameAccepted, req.ID, nil))
		drainFrames(c, nil)
	})
	if !errors.Is(got.err, ErrProtocol) {
		t.Fatalf("err = %v, want ErrProtocol", got.err)
	}
}

// TestRunCutBeforeAccept: a stream that ends before the agent's FrameAccepted says so (a driver may then report
// its sandbox gone and the command retried), and one that ends after it never does (the command may have run).
func TestRunCutBeforeAccept(t *testing.T) {
	before := runFake(t, t.Context(), testRequest(1), nil, func(c net.Conn, req Request) {
		c.Write(frame(FrameStdout, 1, []byte("x")))
	})
	if !errors.Is(before.err, ErrCutBeforeAccept) || !errors.Is(before.err, io.ErrUnexpectedEOF) {
		t.Fatalf("cut before the accept: err = %v; want ErrCutBeforeAccept and io.ErrUnexpectedEOF", before.err)
	}
	after := runFake(t, t.Context(), testRequest(1), nil, func(c net.Conn, req Request) {
		c.Write(frame(FrameAccepted, 1, nil))
		c.Write(frame(FrameStdout, 1, []byte("x")))
	})
	if !errors.Is(after.err, ErrProtocol) || errors.Is(after.err, ErrCutBeforeAccept) {
		t.Fatalf("cut after the accept: err = %v; want ErrProtocol without ErrCutBeforeAccept", after.err)
	}
}
