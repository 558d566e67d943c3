package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
)

// executors makes the remotecommand executors of one exec.
type executors struct{ cfg *rest.Config }

func newExecutors(cfg *rest.Config) *executors { return &executors{cfg: cfg} }

// streamWait bounds how long Exec waits for the exec stream to end once the agent's report is in and its stdin
// is closed (the agent's serve exits on EOF).
const streamWait = 10 * time.Second

// Exec runs req through `sandkeep-agent serve` in an exec through the API server (WebSocket, SPDY fallback) and
// speaks the agent protocol over its stdin and stdout; the agent's stderr is kept for diagnostics. The pod's
// agent channel (AgentChannel) is the lifecycle's to use: Exec is always the API server's exec.
func (d *Driver) Exec(ctx context.Context, sb *driver.Sandbox, req agentproto.Request, out driver.Output) (agentproto.Result, error) {
	if err := d.execTarget(ctx, sb); err != nil {
		return agentproto.Result{}, err
	}
	ex, err := d.executor(sb.Name)
	if err != nil {
		return agentproto.Result{}, fmt.Errorf("exec in %s: %w", sb.Name, err)
	}
	stdinR, stdinW := io.Pipe()
	framesR, framesW := io.Pipe()
	diag := &driver.DiagBuffer{Limit: driver.AgentDiagLimit}
	// The stream outlives ctx on purpose: on cancel, agentproto.Run sends a cancel frame and waits for the
	// agent's report, which must still be able to travel.
	streamCtx, cancelStream := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelStream()
	streamErr := make(chan error, 1)
	go func() {
		err := ex.StreamWithContext(streamCtx, remotecommand.StreamOptions{Stdin: stdinR, Stdout: framesW, Stderr: diag})
		framesW.CloseWithError(errOrEOF(err))
		stdinR.CloseWithError(io.ErrClosedPipe)
		streamErr <- err
	}()

	res, runErr := agentproto.RunWith(ctx, agentConn{r: framesR, w: stdinW}, req, out.Stdout, out.Stderr, out.Stdin,
		agentproto.RunOptions{Resize: out.Resize})
	// The report is in (or the channel is broken): close the agent's stdin so it exits, then wait for the stream.
	stdinW.Close()
	framesR.CloseWithError(io.ErrClosedPipe)
	var serr error
	select {
	case serr = <-streamErr:
	case <-time.After(streamWait):
		cancelStream()
		serr = <-streamErr
	}
	if runErr != nil && errors.Is(runErr, agentproto.ErrProtocol) {
		return res, d.protocolError(sb, serr, diag.Bytes(), runErr)
	}
	return res, runErr
}

func errOrEOF(err error) error {
	if err == nil {
		return io.EOF
	}
	return err
}

// execTarget classifies a sandbox that cannot take a command: absent (ErrNotFound) or not running (ErrConflict).
func (d *Driver) execTarget(ctx context.Context, sb *driver.Sandbox) error {
	pod, err := d.api.CoreV1().Pods(d.opts.Namespace).Get(ctx, sb.Name, metav1.GetOptions{})
	if err == nil && ownedBy(pod, types.UID(sb.ID)) {
		if isRunning(pod) {
			return nil
		}
		return notRunning(sb.Name)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("exec in %s: %w", sb.Name, err)
	}
	// No pod of this sandbox: is the sandbox there at all?
	if _, _, err := d.record(ctx, sb); err != nil {
		return fmt.Errorf("exec in %w", err)
	}
	return notRunning(sb.Name)
}

var errNotRunning = errors.New("sandbox is not running")

func notRunning(name string) error {
	return fmt.Errorf("exec in %s: %w: %w", name, errNotRunning, cerrdefs.ErrConflict)
}

// executor is a WebSocket executor with SPDY as the fallback for API servers (or proxies) without it.
func (d *Driver) executor(pod string) (remotecommand.Executor, error) {
	req := d.api.CoreV1().RESTClient().Post().Namespace(d.opts.Namespace).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: ContainerName, Command: []string{driver.AgentPath, "serve"},
			Stdin: true, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec)
	return d.executorFor(req.URL())
}

// executorFor is executor for the exec request at u.
func (d *Driver) executorFor(u *url.URL) (remotecommand.Executor, error) {
	ws, err := remotecommand.NewWebSocketExecutor(d.execs.cfg, "GET", u.String())
	if err != nil {
		return nil, err
	}
	spdy, err := remotecommand.NewSPDYExecutor(d.execs.cfg, "POST", u)
	if err != nil {
		return nil, err
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

// protocolError adds what the agent said on stderr and how the exec ended, for the operator.
func (d *Driver) protocolError(sb *driver.Sandbox, streamErr error, diag []byte, err error) error {
	detail := ""
	if streamErr != nil {
		detail = fmt.Sprintf(" (exec: %v)", streamErr)
	}
	if len(diag) > 0 {
		detail += fmt.Sprintf(" agent stderr: %q", bytes.TrimSpace(diag))
	}
	return fmt.Errorf("exec in %s%s: %w", sb.Name, detail, err)
}

// agentConn joins the exec's stdout (frames from the agent) and stdin (frames to it) into an agentproto.Conn.
type agentConn struct {
	r io.Reader
	w io.Writer
}

func (c agentConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c agentConn) Write(p []byte) (int, error) { return c.w.Write(p) }
