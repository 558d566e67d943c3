package files

import (
	"context"
	"errors"
	"io"
	"os"
)

// viaAgent: this test binary runs the package's tests against OpenRemote's FS, every operation through the wire
// of `sandkeep-agent fs` (wire.go) to Serve in this process (TestViaAgent sets it for a second run of the whole
// suite). The kubernetes suites run the same wire against a real pod's agent.
var viaAgent = os.Getenv("SANDKEEP_FILES_VIA_AGENT") == "1"

// inProcessAgent is a Runner that serves each operation in this process, on the workspace directory ws, as uid:gid,
// the way the agent in a sandbox does: its stdin, stdout and stderr are the operation's, stdout bounded, ctx
// stopping its reads and writes.
func inProcessAgent(ws string, uid, gid int) Runner {
	return func(ctx context.Context, arg string, stdin io.Reader, stdout, stderr io.Writer, limit int64) (int, error) {
		if stdin == nil {
			stdin = eofReader{}
		}
		out := &limitWriter{ctx: ctx, w: stdout, left: limit}
		code := serveAs(ws, uid, gid, []string{arg}, ctxReader{ctx, stdin}, out, stderr)
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if out.over {
			return 0, errors.New("stdout over its bound")
		}
		return code, nil
	}
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// limitWriter passes on at most left bytes and fails past them; ctx done fails it too.
type limitWriter struct {
	ctx  context.Context
	w    io.Writer
	left int64
	over bool
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if err := l.ctx.Err(); err != nil {
		return 0, err
	}
	if int64(len(p)) > l.left {
		l.over = true
		return 0, errors.New("over the bound")
	}
	l.left -= int64(len(p))
	return l.w.Write(p)
}
