package files

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
)

// Serve runs one file operation as `sandkeep-agent fs OP` does inside the sandbox (see wire.go): on the
// workspace directory root, through the same os.Root confinement and Limits as on the host, as the process's own
// user (the sandbox's: files it creates are the sandbox user's without a chown). args are the arguments after
// "fs". It returns the exit status: 0, 1 with a Reply on stderr, 2 for a usage error.
func Serve(root string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return serveAs(root, -1, -1, args, stdin, stdout, stderr)
}

// serveAs is Serve with the owner of what it creates (tests run it in-process, as root, with a sandbox uid).
func serveAs(root string, uid, gid int, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: sandkeep-agent fs OP (the JSON of a file operation)")
		return 2
	}
	op, err := ParseOp(args[0])
	if err != nil {
		fmt.Fprintf(stderr, "sandkeep-agent fs: %v\n", err)
		return 2
	}
	out := bufio.NewWriterSize(stdout, 64<<10)
	err = serveOp(op, root, uid, gid, stdin, out)
	if ferr := out.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("write the result: %w", ferr)
	}
	if err != nil {
		b, _ := json.Marshal(replyOf(err))
		fmt.Fprintf(stderr, "%s\n", b)
		return 1
	}
	return 0
}

func serveOp(op Op, root string, uid, gid int, stdin io.Reader, out io.Writer) error {
	f, err := Open(root, uid, gid, op.Limits)
	if err != nil {
		return err
	}
	defer f.Close()
	// The agent kills this process when the host cancels; nothing here needs a context of its own.
	ctx := context.Background()
	enc := json.NewEncoder(out)
	switch op.Op {
	case OpStat:
		e, err := f.Stat(op.Path)
		if err != nil {
			return err
		}
		return enc.Encode(e)
	case OpList:
		entries, err := f.List(op.Path)
		if err != nil {
			return err
		}
		return enc.Encode(entries)
	case OpRead:
		rc, e, err := f.OpenFile(op.Path)
		if err != nil {
			return err
		}
		defer rc.Close()
		if err := enc.Encode(e); err != nil {
			return err
		}
		if _, err := copyBuffer(out, rc); err != nil {
			return fmt.Errorf("read %s: %w", op.Path, err)
		}
		return nil
	case OpWrite:
		n, err := f.Write(ctx, op.Path, NewChunkReader(stdin), fs.FileMode(op.Mode))
		if err != nil {
			return err
		}
		return enc.Encode(written{Bytes: n})
	case OpExtract:
		sum, err := f.ExtractTar(ctx, op.Path, NewChunkReader(stdin))
		if eerr := enc.Encode(sum); err == nil {
			err = eerr
		}
		return err
	case OpTar:
		return f.WriteTar(ctx, op.Path, out)
	}
	return fmt.Errorf("unknown operation %q", op.Op)
}

// written is a write's answer on stdout.
type written struct {
	Bytes int64 `json:"bytes"`
}
