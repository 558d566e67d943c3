package files

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"sync/atomic"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// Runner runs `sandkeep-agent fs arg` in the sandbox that holds the workspace, as the sandbox's user, and
// returns its exit status once it has exited. stdin (nil: none) is its standard input; stdout and stderr get its
// output as it comes, stdout bounded by stdoutLimit (more is an error, never kept). A cancelled ctx stops it (its
// process tree is killed) and returns ctx's error. An error means the operation's outcome is unknown.
type Runner func(ctx context.Context, arg string, stdin io.Reader, stdout, stderr io.Writer, stdoutLimit int64) (exit int, err error)

// OpenRemote opens a workspace that is not on this host (a Kubernetes pod's claim): every operation runs inside
// the sandbox through run, as `sandkeep-agent fs` (wire.go), which applies the same confinement (an os.Root of
// /workspace, no link ever followed), the same Limits and the same faults as Open's FS does on the host. ctx
// bounds the operations that take none (Stat, List, OpenFile and its reader); the caller closes the FS.
func OpenRemote(ctx context.Context, run Runner, lim Limits) *FS {
	return &FS{run: run, ctx: ctx, lim: lim.withDefaults()}
}

// Remote reports whether f's operations run in the sandbox (OpenRemote) rather than on a host directory.
func (f *FS) Remote() bool { return f.run != nil }

// Bounds of what the agent may send back, beyond the data the limits allow.
const (
	maxEntryBytes  = 4*MaxPathLen + 1024 // one Entry as JSON: a name and a link target, escaped
	maxHeaderBytes = maxEntryBytes       // read's header line
	maxSmallOut    = 64 << 10            // stat's and write's answers, extract's summary
)

// op is the Op for p's components, with f's limits.
func (f *FS) op(name string, comps []string) Op {
	return Op{Op: name, Path: joinComps(comps), Limits: f.lim}
}

// call runs op with stdin (nil: none) and returns its stdout (at most maxSmallOut bytes). A refusal is the
// agent's fault (ParseReply).
func (f *FS) call(ctx context.Context, op Op, stdin io.Reader, comps []string) ([]byte, error) {
	var out bytes.Buffer
	err := f.exec(ctx, op, stdin, &out, maxSmallOut, comps)
	return out.Bytes(), err
}

// exec runs op, its stdout to out, bounded by limit; a refusal is the agent's fault (ParseReply), a status
// other than 0 or 1 an error wrapping ErrAgent.
func (f *FS) exec(ctx context.Context, op Op, stdin io.Reader, out io.Writer, limit int64, comps []string) error {
	arg, err := json.Marshal(op)
	if err != nil {
		return err
	}
	stderr := &boundedBuffer{max: maxReplyBytes + 1}
	code, err := f.run(ctx, string(arg), stdin, out, stderr, limit)
	switch {
	case err != nil:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	case code == 0:
		return nil
	case code == 1:
		return ParseReply(stderr.Bytes(), display(comps))
	}
	return fmt.Errorf("%w: `sandkeep-agent fs` exited %d: %s (an agent of this version serves the file API)",
		ErrAgent, code, printable(stderr.String(), 200))
}

func (f *FS) remoteStat(comps []string) (Entry, error) {
	out, err := f.call(f.ctx, f.op(OpStat, comps), nil, comps)
	if err != nil {
		return Entry{}, err
	}
	return decodeEntry(out, comps)
}

// decodeEntry parses one Entry the agent sent for comps and checks it.
func decodeEntry(b []byte, comps []string) (Entry, error) {
	var e Entry
	if err := json.Unmarshal(b, &e); err != nil {
		return Entry{}, fmt.Errorf("%w: an entry for %s: %v", ErrAgent, display(comps), err)
	}
	if err := checkEntry(e); err != nil {
		return Entry{}, fmt.Errorf("%w: an entry for %s: %v", ErrAgent, display(comps), err)
	}
	return e, nil
}

// checkEntry refuses an Entry that the agent's FS could not have produced.
func checkEntry(e Entry) error {
	switch {
	case e.Name == "" || len(e.Name) > MaxNameLen || e.Name == "." || e.Name == ".." || bytes.ContainsAny([]byte(e.Name), "/\x00"):
		return fmt.Errorf("the name %q", e.Name)
	case e.Size < 0:
		return fmt.Errorf("the size %d", e.Size)
	case len(e.Mode) != 4 || !isOctal(e.Mode):
		return fmt.Errorf("the mode %q", e.Mode)
	case e.Type != TypeFile && e.Type != TypeDir && e.Type != TypeSymlink && e.Type != TypeOther:
		return fmt.Errorf("the type %q", e.Type)
	case len(e.Target) > MaxPathLen || (e.Target != "" && e.Type != TypeSymlink):
		return errors.New("the link target")
	}
	return nil
}

func isOctal(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '7' {
			return false
		}
	}
	return true
}

func (f *FS) remoteList(comps []string) ([]Entry, error) {
	var out []Entry
	err := f.stream(f.ctx, f.op(OpList, comps), listLimit(f.lim), comps, func(r io.Reader) error {
		dec := json.NewDecoder(r)
		if t, err := dec.Token(); err != nil || t != json.Delim('[') {
			return fmt.Errorf("%w: the listing of %s does not start as an array", ErrAgent, display(comps))
		}
		for dec.More() {
			if len(out) >= f.lim.MaxTarEntries {
				return fmt.Errorf("%w: the listing of %s has more than %d entries", ErrAgent, display(comps), f.lim.MaxTarEntries)
			}
			var e Entry
			if err := dec.Decode(&e); err != nil {
				return fmt.Errorf("%w: the listing of %s: %v", ErrAgent, display(comps), err)
			}
			if err := checkEntry(e); err != nil {
				return fmt.Errorf("%w: the listing of %s: %v", ErrAgent, display(comps), err)
			}
			out = append(out, e)
		}
		if _, err := dec.Token(); err != nil {
			return fmt.Errorf("%w: the listing of %s: %v", ErrAgent, display(comps), err)
		}
		if rest, _ := io.ReadAll(dec.Buffered()); len(bytes.TrimSpace(rest)) > 0 {
			return fmt.Errorf("%w: more output than the listing of %s", ErrAgent, display(comps))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if out == nil {
		out = []Entry{}
	}
	return out, nil
}

// listLimit bounds a listing's JSON: MaxTarEntries entries of at most maxEntryBytes each.
func listLimit(l Limits) int64 { return int64(l.MaxTarEntries)*maxEntryBytes + 2 }

// tarLimit bounds a tar stream of l: its file bytes, and per entry a header with PAX records for long names
// and the padding.
func tarLimit(l Limits) int64 {
	return min(l.MaxTarBytes+int64(l.MaxTarEntries+2)*(3*512+4*MaxPathLen)+2*512, maxBytes)
}

// stream runs op with its stdout piped to read, in this goroutine, and returns once both are done: the run's
// outcome when it failed, else read's error. When read returns early (an error), the run is cancelled.
func (f *FS) stream(ctx context.Context, op Op, limit int64, comps []string, read func(io.Reader) error) error {
	outer := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := f.exec(ctx, op, nil, pw, limit, comps)
		pw.CloseWithError(errOrEOF(err))
		done <- err
	}()
	rerr := read(pr)
	if rerr == nil {
		// Past what read wanted there is at most a newline; reading to the end also ends the run's writes.
		rest, err := io.ReadAll(io.LimitReader(pr, 16))
		switch {
		case err != nil:
			rerr = err
		case len(bytes.TrimSpace(rest)) > 0 || len(rest) == 16:
			rerr = fmt.Errorf("%w: more output than the answer for %s", ErrAgent, display(comps))
		}
	}
	if rerr != nil {
		cancel()
		pr.CloseWithError(io.ErrClosedPipe)
	}
	err := <-done
	switch {
	case outer.Err() != nil:
		return outer.Err()
	case rerr != nil && errors.Is(err, context.Canceled):
		return rerr // the run was stopped because read gave up
	case err != nil:
		return err
	}
	return rerr
}

func errOrEOF(err error) error {
	if err == nil {
		return io.EOF
	}
	return err
}

func (f *FS) remoteOpen(comps []string) (io.ReadCloser, Entry, error) {
	ctx, cancel := context.WithCancel(f.ctx)
	pr, pw := io.Pipe()
	rf := &remoteFile{pr: pr, cancel: cancel, done: make(chan error, 1)}
	go func() {
		err := f.exec(ctx, f.op(OpRead, comps), nil, pw, maxHeaderBytes+1+f.lim.MaxFileBytes, comps)
		pw.CloseWithError(errOrEOF(err))
		rf.done <- err
	}()
	rf.br = bufio.NewReaderSize(io.LimitReader(pr, maxHeaderBytes+1+f.lim.MaxFileBytes), 64<<10)
	line, err := readLine(rf.br, maxHeaderBytes)
	if errors.Is(err, errLongLine) {
		rf.Close()
		return nil, Entry{}, fmt.Errorf("%w: the header for %s: %v", ErrAgent, display(comps), err)
	}
	if err != nil {
		// The pipe ended, so the run did: its outcome says why there is no header (a refusal, mostly).
		rerr := rf.result()
		rf.Close()
		if rerr != nil {
			return nil, Entry{}, rerr
		}
		return nil, Entry{}, fmt.Errorf("%w: no header for %s: %v", ErrAgent, display(comps), err)
	}
	e, err := decodeEntry(line, comps)
	if err == nil && (e.Type != TypeFile || e.Size > f.lim.MaxFileBytes) {
		err = fmt.Errorf("%w: a header for %s that the agent could not send (%s of %d bytes)", ErrAgent, display(comps), e.Type, e.Size)
	}
	if err != nil {
		rf.Close()
		return nil, Entry{}, err
	}
	rf.left = e.Size
	return rf, e, nil
}

var errLongLine = errors.New("a header line over its bound")

// readLine reads one line of at most max bytes (without its newline).
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		b, err := br.ReadSlice('\n')
		line = append(line, b...)
		if len(line) > max+1 {
			return nil, errLongLine
		}
		if err == nil {
			return line[:len(line)-1], nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

// remoteFile is a download from the sandbox: the file's bytes, at most the size its header gave, then the
// agent's exit status (a failure after the header is a read error, so that a cut download never looks whole).
type remoteFile struct {
	pr     *io.PipeReader
	br     *bufio.Reader
	left   int64
	cancel context.CancelFunc
	done   chan error

	once   sync.Once
	runErr error
	closed atomic.Bool
}

func (r *remoteFile) Read(p []byte) (int, error) {
	if r.closed.Load() {
		return 0, fs.ErrClosed
	}
	if r.left <= 0 {
		if err := r.result(); err != nil {
			return 0, err
		}
		return 0, io.EOF
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	n, err := r.br.Read(p)
	r.left -= int64(n)
	if errors.Is(err, io.EOF) {
		// The agent ended early: the file shrank while it was read (fine, as on the host), or it failed.
		if rerr := r.result(); rerr != nil {
			return n, rerr
		}
		r.left = 0
		if n > 0 {
			return n, nil
		}
		return 0, io.EOF
	}
	return n, err
}

// result waits for the run and returns its outcome.
func (r *remoteFile) result() error {
	r.once.Do(func() { r.runErr = <-r.done })
	return r.runErr
}

// Close stops the run when it is still going and waits for it.
func (r *remoteFile) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	// Stop a run that is still going (a download given up on), then wait for it: no goroutine outlives Close.
	r.cancel()
	r.pr.CloseWithError(io.ErrClosedPipe)
	r.result()
	return nil
}

// remoteWrite is Write through the agent: r goes chunked on stdin, so that a reader that fails leaves nothing.
func (f *FS) remoteWrite(ctx context.Context, comps []string, r io.Reader, mode fs.FileMode) (int64, error) {
	op := f.op(OpWrite, comps)
	op.Mode = uint32(mode.Perm())
	var stopped atomic.Bool
	enc := newChunkEncoder(r, stopped.Load)
	out, err := f.call(ctx, op, enc, comps)
	stopped.Store(true)
	if enc.err != nil {
		return 0, &ReadError{Path: display(comps), Err: enc.err}
	}
	if err != nil {
		return 0, err
	}
	var w written
	if err := json.Unmarshal(out, &w); err != nil || w.Bytes < 0 || w.Bytes > f.lim.MaxFileBytes {
		return 0, fmt.Errorf("%w: the answer to a write of %s: %q", ErrAgent, display(comps), printable(string(out), 200))
	}
	return w.Bytes, nil
}

func (f *FS) remoteExtract(ctx context.Context, comps []string, r io.Reader) (TarSummary, error) {
	var stopped atomic.Bool
	enc := newChunkEncoder(r, stopped.Load)
	out, err := f.call(ctx, f.op(OpExtract, comps), enc, comps)
	stopped.Store(true)
	var sum TarSummary
	if jerr := json.Unmarshal(out, &sum); jerr != nil || sum.Files < 0 || sum.Dirs < 0 || sum.Links < 0 || sum.Bytes < 0 {
		sum = TarSummary{}
		if err == nil {
			err = fmt.Errorf("%w: the summary of an extraction into %s: %q", ErrAgent, display(comps), printable(string(out), 200))
		}
	}
	if enc.err != nil {
		var re *ReadError
		if errors.As(err, &re) || err == nil || fault.CodeOf(err) == fault.InvalidArgument {
			err = fault.Wrap(&ReadError{Path: display(comps), Err: enc.err}, fault.InvalidArgument,
				"send a whole, uncompressed tar stream (tar -cf - ...)", "the tar stream for %s is cut off: %v", display(comps), enc.err)
		}
	}
	return sum, err
}

func (f *FS) remoteTar(ctx context.Context, comps []string, w io.Writer) error {
	return f.stream(ctx, f.op(OpTar, comps), tarLimit(f.lim), comps, func(r io.Reader) error {
		_, err := copyBuffer(w, r)
		return err
	})
}

// boundedBuffer keeps the first max bytes written to it and discards the rest.
type boundedBuffer struct {
	bytes.Buffer
	max int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
