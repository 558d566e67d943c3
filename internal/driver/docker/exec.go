package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
)

// Exec runs req through `sandkeep-agent serve` in a Docker exec and speaks the agent protocol over the
// hijacked, stdcopy-multiplexed stream: the agent's stdout carries the frames, its stderr its diagnostics.
func (d *Driver) Exec(ctx context.Context, sb *driver.Sandbox, req agentproto.Request, out driver.Output) (agentproto.Result, error) {
	created, err := d.api.ExecCreate(ctx, sb.ID, client.ExecCreateOptions{
		AttachStdin: true, AttachStdout: true, AttachStderr: true,
		Cmd: []string{driver.AgentPath, "serve"},
	})
	if err != nil {
		return agentproto.Result{}, d.execCreateError(sb, err)
	}
	att, err := d.api.ExecAttach(ctx, created.ID, client.ExecAttachOptions{})
	if err != nil {
		return agentproto.Result{}, d.execCreateError(sb, err)
	}
	defer att.Close()

	frames, demux := demultiplex(att.Reader)
	res, runErr := agentproto.RunWith(ctx, agentConn{r: frames, w: att.Conn}, req, out.Stdout, out.Stderr, out.Stdin,
		agentproto.RunOptions{Resize: out.Resize})
	// The report is in (or the channel is broken): end the stream so the demultiplexer returns.
	_ = att.CloseWrite()
	att.Close()
	diag := demux.wait()
	if runErr != nil && errors.Is(runErr, agentproto.ErrProtocol) {
		return res, d.protocolError(context.WithoutCancel(ctx), sb, created.ID, diag, runErr)
	}
	return res, runErr
}

func (d *Driver) execCreateError(sb *driver.Sandbox, err error) error {
	switch {
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("exec in %s: %w", sb.Name, cerrdefs.ErrNotFound)
	case cerrdefs.IsConflict(err):
		// Docker answers 409 for "container is not running" and "container is paused".
		return notRunning(sb.Name)
	}
	return fmt.Errorf("exec in %s: %w", sb.Name, err)
}

// protocolError adds what the agent said on stderr and how its process ended, for the operator.
func (d *Driver) protocolError(ctx context.Context, sb *driver.Sandbox, execID string, diag []byte, err error) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	detail := ""
	if ins, ierr := d.api.ExecInspect(ctx, execID, client.ExecInspectOptions{}); ierr == nil && !ins.Running {
		detail = fmt.Sprintf(" (agent exited %d)", ins.ExitCode)
	}
	if len(diag) > 0 {
		detail += fmt.Sprintf(" agent stderr: %q", bytes.TrimSpace(diag))
	}
	return fmt.Errorf("exec in %s%s: %w", sb.Name, detail, err)
}

// agentConn joins the demultiplexed frame stream and the hijacked connection into an agentproto.Conn.
type agentConn struct {
	r io.Reader
	w io.Writer
}

func (c agentConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c agentConn) Write(p []byte) (int, error) { return c.w.Write(p) }

// demuxer owns the goroutine that splits Docker's multiplexed stream.
type demuxer struct {
	done chan struct{}
	diag *driver.DiagBuffer
}

// demultiplex starts copying src's stdout part into the returned reader and keeps a bounded copy of its
// stderr part. The goroutine ends when src ends (the caller closes the connection).
func demultiplex(src io.Reader) (io.Reader, *demuxer) {
	pr, pw := io.Pipe()
	dm := &demuxer{done: make(chan struct{}), diag: &driver.DiagBuffer{Limit: driver.AgentDiagLimit}}
	go func() {
		defer close(dm.done)
		_, err := stdcopy.StdCopy(pw, dm.diag, src)
		if err == nil {
			err = io.EOF
		}
		pw.CloseWithError(err)
	}()
	return pr, dm
}

func (dm *demuxer) wait() []byte {
	<-dm.done
	return dm.diag.Bytes()
}
