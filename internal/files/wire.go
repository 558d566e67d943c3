package files

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// The wire of the file API through the agent: what the host (remote.go) and `sandkeep-agent fs` (agent.go) say
// to each other. The host runs `sandkeep-agent fs OP` as an ordinary command through the agent protocol (the
// agent channel, or the engine's exec), OP being the JSON of an Op. The data travels on the command's stdin and
// stdout, in agentproto frames like any command's:
//
//	stat     stdout: the Entry, as JSON
//	list     stdout: the entries, as a JSON array (decoded as a stream, at most MaxTarEntries)
//	read     stdout: the Entry as one JSON line, then exactly Entry.Size bytes of the file (fewer if it shrank)
//	write    stdin: the content, chunked (below); stdout: {"bytes": N}
//	extract  stdin: the tar stream, chunked; stdout: the TarSummary (also after a failure: what was written)
//	tar      stdout: the tar stream
//
// Exit status 0 is success; 1 is a refusal or failure, with one Reply as JSON on stderr; anything else is a
// failure of the command itself (an agent without `fs`, a signal). The host never trusts what comes back (the
// sandbox's processes share the agent's uid): every reply is size-bounded, parsed strictly, and only the file
// codes (fileCodes) are believed; stdout is bounded by the operation's limits.
//
// Chunked stdin: each chunk is a 4-byte big-endian length (1..maxChunk) and that many bytes; a zero length ends
// the stream. The agent commits a file only after the end marker: a stream cut short (the host's reader failed,
// the channel broke) never lands as a shorter file.

// Op is one file operation, the argument of `sandkeep-agent fs`.
type Op struct {
	Op     string `json:"op"`   // one of the Op* names
	Path   string `json:"path"` // clean and relative to the workspace ("." for itself), as CleanPath returns
	Mode   uint32 `json:"mode,omitempty"`
	Limits Limits `json:"limits"`
}

// Operations, the values of Op.Op.
const (
	OpStat    = "stat"
	OpList    = "list"
	OpRead    = "read"
	OpWrite   = "write"
	OpExtract = "extract"
	OpTar     = "tar"
)

// maxOpBytes bounds an encoded Op: a path of MaxPathLen bytes, JSON-escaped, and the rest.
const maxOpBytes = 6*MaxPathLen + 512

// ParseOp reads an Op, strictly: known fields only, a known operation, a path CleanPath accepts and leaves as it
// is, a mode within 0777 (write only), limits that are not negative.
func ParseOp(arg string) (Op, error) {
	bad := func(format string, a ...any) (Op, error) {
		return Op{}, fmt.Errorf("file operation: "+format, a...)
	}
	if len(arg) > maxOpBytes {
		return bad("%d bytes, over %d", len(arg), maxOpBytes)
	}
	dec := json.NewDecoder(strings.NewReader(arg))
	dec.DisallowUnknownFields()
	var op Op
	if err := dec.Decode(&op); err != nil {
		return bad("%v", err)
	}
	if dec.More() {
		return bad("trailing data")
	}
	switch op.Op {
	case OpStat, OpList, OpRead, OpWrite, OpExtract, OpTar:
	default:
		return bad("unknown operation %q", op.Op)
	}
	clean, err := CleanPath(op.Path)
	if err != nil || clean != op.Path {
		return bad("path %q is not clean and relative", op.Path)
	}
	if op.Mode&^0o777 != 0 || (op.Mode != 0 && op.Op != OpWrite) {
		return bad("mode %#o", op.Mode)
	}
	if l := op.Limits; l.MaxFileBytes < 0 || l.MaxTarBytes < 0 || l.MaxTarEntries < 0 {
		return bad("negative limits")
	}
	return op, nil
}

// Reply is what `sandkeep-agent fs` writes to stderr when it exits 1.
type Reply struct {
	Code      fault.Code `json:"code,omitempty"` // a file fault's code; empty for any other failure
	Message   string     `json:"message"`
	Hint      string     `json:"hint,omitempty"`
	ReadError bool       `json:"read_error,omitempty"` // the data it was given ended early or was malformed (*ReadError)
}

// maxReplyBytes bounds a Reply on stderr: messages name up to two paths of MaxPathLen bytes.
const maxReplyBytes = 16 << 10

// maxReplyText bounds each text field of a Reply once parsed.
const maxReplyText = 3 * MaxPathLen

// fileCodes are the codes the host believes from the agent: those package files gives its faults. Anything
// else (a forged code that would mean something to the caller, such as an auth failure) is not believed.
var fileCodes = map[fault.Code]bool{
	fault.InvalidPath: true, fault.FileNotFound: true, fault.FileType: true, fault.PathConflict: true,
	fault.FileTooLarge: true, fault.WorkspaceFull: true, fault.InvalidArgument: true,
}

// replyOf is the Reply for err, as the agent reports it.
func replyOf(err error) Reply {
	var fe *fault.Error
	if errors.As(err, &fe) && fileCodes[fe.Code] {
		return Reply{Code: fe.Code, Message: fe.Message, Hint: fe.Hint}
	}
	var re *ReadError
	if errors.As(err, &re) {
		return Reply{Message: err.Error(), ReadError: true}
	}
	return Reply{Message: err.Error()}
}

// ErrAgent marks a reply from the agent that is not a file fault: the operation failed in the sandbox for a
// reason of the sandbox's (or the reply was unreadable).
var ErrAgent = errors.New("the file operation failed in the sandbox")

// ParseReply turns what the agent wrote on stderr into the error it reports: a *fault.Error for a file code, a
// *ReadError (for path) for a read error, else an error wrapping ErrAgent. Text is cut to one printable line.
func ParseReply(b []byte, path string) error {
	var r Reply
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if len(b) > maxReplyBytes || dec.Decode(&r) != nil || dec.More() {
		return fmt.Errorf("%w: %s", ErrAgent, printable(string(b), 200))
	}
	msg, hint := printable(r.Message, maxReplyText), printable(r.Hint, maxReplyText)
	switch {
	case r.ReadError:
		return &ReadError{Path: path, Err: fmt.Errorf("in the sandbox: %s", msg)}
	case r.Code != "" && fileCodes[r.Code] && msg != "":
		return fault.New(r.Code, hint, "%s", msg)
	}
	return fmt.Errorf("%w: %s", ErrAgent, msg)
}

// printable is s as one line of printable text of at most n bytes (whole runes).
func printable(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return -1
		}
		return r
	}, s)
	if len(s) > n {
		cut := n
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return strings.TrimSpace(s)
}

// maxChunk is the largest chunk of a chunked stdin.
const maxChunk = 1 << 20

// errChunks marks a chunked stream that is malformed (a length over maxChunk).
var errChunks = errors.New("malformed chunked stream")

// chunkReader decodes a chunked stream: Read returns the chunks' bytes, io.EOF after the end marker, and
// io.ErrUnexpectedEOF when the stream ends before it.
type chunkReader struct {
	r    io.Reader
	left int // bytes of the current chunk still to read
	done bool
}

// NewChunkReader decodes the chunked stream r.
func NewChunkReader(r io.Reader) io.Reader { return &chunkReader{r: r} }

func (c *chunkReader) Read(p []byte) (int, error) {
	if c.done {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	if c.left == 0 {
		var hdr [4]byte
		if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
			return 0, unexpected(err)
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 {
			c.done = true
			return 0, io.EOF
		}
		if n > maxChunk {
			return 0, fmt.Errorf("%w: a chunk of %d bytes, over %d", errChunks, n, maxChunk)
		}
		c.left = int(n)
	}
	if len(p) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= n
	if err != nil && (c.left > 0 || n == 0) {
		return n, unexpected(err)
	}
	return n, nil
}

// unexpected is err, with io.EOF turned into io.ErrUnexpectedEOF: no chunked stream ends but at its marker.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// chunkEncoder reads src and returns it chunked, with the end marker after src's io.EOF. Another error of src
// is kept (Err) and returned, and no end marker follows: the agent sees a cut stream and writes nothing. Once
// stopped, it reads src no more.
type chunkEncoder struct {
	src     io.Reader
	buf     []byte // encoded, not yet returned
	scratch []byte
	ended   bool
	err     error // src's error, other than io.EOF
	stop    func() bool
}

// encChunk is the chunk size the host sends.
const encChunk = 32 << 10

func newChunkEncoder(src io.Reader, stopped func() bool) *chunkEncoder {
	return &chunkEncoder{src: src, scratch: make([]byte, 4+encChunk), stop: stopped}
}

func (e *chunkEncoder) Read(p []byte) (int, error) {
	for len(e.buf) == 0 {
		if e.ended {
			return 0, io.EOF
		}
		if e.err != nil {
			return 0, e.err
		}
		if e.stop() {
			return 0, io.ErrClosedPipe
		}
		n, err := e.src.Read(e.scratch[4:])
		if n > 0 {
			binary.BigEndian.PutUint32(e.scratch[:4], uint32(n))
			e.buf = e.scratch[:4+n]
		}
		switch {
		case errors.Is(err, io.EOF):
			e.ended = true
			e.buf = append(e.buf, 0, 0, 0, 0)
		case err != nil:
			e.err = err
			e.buf = nil // a partial last chunk is not sent either: the stream is cut before it
		}
	}
	n := copy(p, e.buf)
	e.buf = e.buf[n:]
	return n, nil
}
