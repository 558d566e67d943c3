package agentproto

import (
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// stallWriter is a command's stdout whose reader has stalled: every Write waits until release is closed.
type stallWriter struct {
	release chan struct{}
	n       atomic.Int64
}

func (w *stallWriter) Write(p []byte) (int, error) {
	<-w.release
	w.n.Add(int64(len(p)))
	return len(p), nil
}

// sockBuf is the kernel's buffer size (SO_SNDBUF or SO_RCVBUF) of one end of a Unix connection.
func sockBuf(t *testing.T, c net.Conn, opt int) int {
	t.Helper()
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var serr error
	if err := raw.Control(func(fd uintptr) { n, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, opt) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return n
}

// TestMuxOutputStalledReader: a command floods stdout (far beyond what any buffer holds) while the host's reader
// of its output has stalled. Command output has no credit of its own on the channel, but it needs none to stay
// bounded: the Mux holds at most commandQueue frames for the command, then stops reading the channel, so the
// agent's writes block (its pumps wait, and the command then waits on its full pipe). What the agent got written
// into the channel while the reader stalls is at most the queue, the frame in hand and the two kernel socket
// buffers, and the host's heap does not grow with the flood. Once the reader resumes, every byte arrives in
// order and the exit status is the agent's.
func TestMuxOutputStalledReader(t *testing.T) {
	const flood = 32 << 20 // 32 MiB: far more than the bound below, within MaxOutputLimit
	m, agent := muxPair(t)
	host := m.conn.(net.Conn)
	sockets := sockBuf(t, agent, syscall.SO_SNDBUF) + sockBuf(t, host, syscall.SO_RCVBUF)
	frameSize := HeaderSize + MaxFrame
	bound := int64((commandQueue+2)*frameSize + sockets)
	if bound >= flood/4 {
		t.Fatalf("bound %d is not far below the flood %d: the test would prove nothing", bound, flood)
	}

	req := testRequest(7)
	req.TimeoutMS = 300_000          // the flood takes a while under -race on a loaded machine; Run's backstop must not end it
	req.StdoutLimit = MaxOutputLimit // nothing is truncated: every byte must get through
	var sent atomic.Int64
	agentDone := make(chan error, 1)
	go func() {
		var buf []byte
		if _, err := ReadFrame(agent, &buf); err != nil {
			agentDone <- err
			return
		}
		fw := NewFrameWriter(agent)
		if err := fw.WriteFrame(FrameAccepted, 7, nil); err != nil {
			agentDone <- err
			return
		}
		chunk := make([]byte, MaxFrame)
		for i := range flood / MaxFrame {
			chunk[0] = byte(i) // each frame's first byte says which it is: the order is checked below
			if err := fw.WriteFrame(FrameStdout, 7, chunk); err != nil {
				agentDone <- err
				return
			}
			sent.Add(int64(HeaderSize + MaxFrame))
		}
		_, err := agent.Write(resultFrame(t, Result{ID: 7, ExitCode: 3}))
		agentDone <- err
	}()

	out := &orderWriter{stallWriter: stallWriter{release: make(chan struct{})}}
	type ran struct {
		res Result
		err error
	}
	got := make(chan ran, 1)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	go func() {
		res, err := Run(t.Context(), m.Commands(), req, out, nil, nil)
		got <- ran{res, err}
	}()

	// Wait until the agent's writes stop making progress: the channel is full.
	last, still := int64(-1), 0
	for still < 5 {
		select {
		case r := <-got:
			t.Fatalf("Run returned while its reader stalled: %+v, %v", r.res, r.err)
		case <-time.After(100 * time.Millisecond):
		}
		if n := sent.Load(); n == last {
			still++
		} else {
			last, still = n, 0
		}
	}
	runtime.GC()
	var stalled runtime.MemStats
	runtime.ReadMemStats(&stalled)
	if last > bound {
		t.Fatalf("the agent wrote %d bytes into the channel while the reader stalled; bound %d (queue of %d frames of %d, sockets %d)",
			last, bound, commandQueue, frameSize, sockets)
	}
	if grew := int64(stalled.HeapAlloc) - int64(before.HeapAlloc); grew > bound+4<<20 {
		t.Fatalf("the host's heap grew by %d bytes while the reader stalled; bound %d", grew, bound+4<<20)
	}
	t.Logf("stalled after %d of %d bytes (bound %d: queue %d x %d, sockets %d); heap %+d bytes",
		last, flood, bound, commandQueue, frameSize, sockets, int64(stalled.HeapAlloc)-int64(before.HeapAlloc))

	close(out.release)
	r := <-got
	if r.err != nil {
		agent.Close() // the agent may still be writing into a channel nobody reads
		t.Fatalf("Run: %+v, %v", r.res, r.err)
	}
	if err := <-agentDone; err != nil {
		t.Fatalf("agent: %v", err)
	}
	if r.err != nil || r.res.ExitCode != 3 || r.res.StdoutTruncated {
		t.Fatalf("Run: %+v, %v", r.res, r.err)
	}
	if n := out.n.Load(); n != flood {
		t.Fatalf("stdout got %d bytes, want %d", n, flood)
	}
	if out.bad != "" {
		t.Fatal(out.bad)
	}
}

// orderWriter is a stallWriter that checks that the frames' first bytes come in order.
type orderWriter struct {
	stallWriter
	mu   sync.Mutex
	off  int64
	bad  string
	want byte
}

func (w *orderWriter) Write(p []byte) (int, error) {
	n, err := w.stallWriter.Write(p)
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := 0; i < len(p); {
		at := int(w.off % MaxFrame)
		if at == 0 && w.bad == "" && p[i] != w.want {
			w.bad = "a frame came out of order at offset " + strconv.FormatInt(w.off, 10)
		}
		if at == 0 {
			w.want++
		}
		step := min(len(p)-i, MaxFrame-at)
		i += step
		w.off += int64(step)
	}
	return n, err
}
