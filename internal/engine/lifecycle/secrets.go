package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"strings"
	"time"
	"unicode"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// SecretDeliveryFailed: a secret file could not be placed in the sandbox, so the command did not run.
const SecretDeliveryFailed = fault.SecretDeliveryFailed

// MaxSecretBytes bounds one secret's value, and all of one command's secrets together: the size of the secrets
// tmpfs (see the posture) and what the agent's put-file reads.
const MaxSecretBytes = 1 << 20

// Timeouts of the agent's file commands (the agent's deadline for the command; placing also waits for the
// ensure before it, under the caller's ctx). Removal runs under context.WithoutCancel with secretRemoveTimeout:
// it happens whether the command succeeded, failed, timed out or was cancelled.
const (
	secretPutTimeout    = 30 * time.Second
	secretRemoveTimeout = 30 * time.Second
)

// Secret is a file placed in the sandbox's secrets tmpfs (spec.SecretsDir) for one command and removed after
// it. Its Value travels to the agent as the stdin of `sandkeep-agent put-file`, in protocol frames: never in an
// argv, an environment, a label, a log line, an event or an error. String, GoString, LogValue and the json tag
// keep it out of anything that prints a Secret.
type Secret struct {
	Name  string      // for messages
	Path  string      // absolute, clean, under spec.SecretsDir
	Mode  os.FileMode // permission bits; 0 is spec.DefaultSecretMode (0400). The owner must be able to read.
	Value []byte      `json:"-"`
}

// String describes s without its value.
func (s Secret) String() string {
	return fmt.Sprintf("secret %q at %s (%d bytes)", s.Name, s.Path, len(s.Value))
}

// GoString describes s without its value, for %#v.
func (s Secret) GoString() string { return "lifecycle.Secret{" + s.String() + "}" }

// LogValue describes s without its value, for slog.
func (s Secret) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", s.Name), slog.String("path", s.Path), slog.Int("bytes", len(s.Value)))
}

var (
	_ fmt.Stringer   = Secret{}
	_ fmt.GoStringer = Secret{}
	_ slog.LogValuer = Secret{}
)

// mode is s's file mode as put-file reads it: octal with a leading zero.
func (s Secret) mode() string {
	m := s.Mode.Perm()
	if m == 0 {
		m = spec.DefaultSecretMode
	}
	return fmt.Sprintf("%#o", uint32(m))
}

// checkSecrets validates a command's secrets before anything runs. The spec layer checks them too; this is the
// layer that writes them, so it checks again.
func checkSecrets(secrets []Secret) error {
	const hint = "give each secret a clean absolute path of its own under " + spec.SecretsDir + ", e.g. " + spec.SecretsDir + "/npmrc"
	total := 0
	for i, s := range secrets {
		label := fmt.Sprintf("secret %d (%q)", i, s.Name)
		switch {
		case strings.ContainsFunc(s.Name+s.Path, unicode.IsControl):
			return fault.New(fault.InvalidArgument, hint, "secret %d has a control character in its name or path", i)
		case !path.IsAbs(s.Path) || path.Clean(s.Path) != s.Path:
			return fault.New(fault.InvalidArgument, hint, "%s: path %q is not a clean absolute path", label, s.Path)
		case !strings.HasPrefix(s.Path, spec.SecretsDir+"/"):
			return fault.New(fault.InvalidArgument, hint, "%s: path %q is not under %s, the tmpfs secrets live on", label, s.Path, spec.SecretsDir)
		case s.Path == path.Dir(AgentCABundlePath) || strings.HasPrefix(s.Path, path.Dir(AgentCABundlePath)+"/"):
			return fault.New(fault.InvalidArgument, hint, "%s: path %q is under %s, which sandkeep keeps for the egress proxy's CA bundle", label, s.Path, path.Dir(AgentCABundlePath))
		case s.Mode&^os.ModePerm != 0 || (s.Mode != 0 && s.Mode&0o400 == 0):
			return fault.New(fault.InvalidArgument, `use a permission mode that lets the owner read, e.g. 0400`,
				"%s: mode %v is not a file permission the owner can read", label, s.Mode)
		case len(s.Value) > MaxSecretBytes:
			return fault.New(fault.InvalidArgument, "keep secret files under 1 MiB", "%s is %d bytes, over %d", label, len(s.Value), MaxSecretBytes)
		}
		for j, o := range secrets[:i] {
			if o.Path == s.Path || strings.HasPrefix(s.Path, o.Path+"/") || strings.HasPrefix(o.Path, s.Path+"/") {
				return fault.New(fault.InvalidArgument, hint, "%s: path %q collides with the path %q of secret %d", label, s.Path, o.Path, j)
			}
		}
		total += len(s.Value)
	}
	if total > MaxSecretBytes {
		return fault.New(fault.InvalidArgument, "keep a command's secret files under 1 MiB together",
			"the secrets add up to %d bytes, over %d", total, MaxSecretBytes)
	}
	return nil
}

// placeSecrets writes secrets into key's sandbox, one `sandkeep-agent put-file PATH MODE` each, through the
// same path as the command (ensure, then the agent channel or the engine's exec), before the command. The caller
// holds key's gate. remove is never nil: the caller calls it once the command is over, whatever its outcome,
// and also when placeSecrets fails, to take away what was placed.
//
// A put that the agent refused (or that timed out) is SECRET_DELIVERY_FAILED. An error on the way there (the
// sandbox could not be provided, the channel broke, the caller gave up) is returned as the command would have
// met it: it already carries its code.
func (m *Manager) placeSecrets(ctx context.Context, key identity.Key, secrets []Secret, shape *Shape) (remove func(), err error) {
	var sb *driver.Sandbox // the sandbox the files went into
	var placed []string    // paths that may exist in sb, half-written ones included
	remove = func() {
		if sb != nil && len(placed) > 0 {
			m.removeSecrets(ctx, key, sb, placed)
		}
	}
	for _, s := range secrets {
		var diag bytes.Buffer
		req := ExecRequest{
			Argv:   []string{driver.AgentPath, "put-file", s.Path, s.mode()},
			Stdin:  bytes.NewReader(s.Value),
			Stdout: &diag, Stderr: &diag, StdoutLimit: helperOutputLimit, StderrLimit: helperOutputLimit,
			Timeout: secretPutTimeout, Shape: shape,
		}
		preq, err := m.agentRequest(req)
		if err != nil {
			return remove, err
		}
		res, err := m.exec(ctx, key, req, preq, nil) // a helper command: no exec events of its own
		// Whatever happened, the put may have reached the sandbox this process now knows for key.
		if cur := m.cached(key); cur != nil {
			if sb != nil && sb.ID != cur.ID {
				placed = nil // the sandbox was replaced: what went into the old one went with it
			}
			sb = cur
			placed = append(placed, s.Path)
		}
		switch {
		case err != nil:
			return remove, err
		case res.ExitCode != 0 || res.TimedOut || res.StartError != "":
			return remove, fault.New(SecretDeliveryFailed,
				"the command did not run; check the secret's path and size, and what the command leaves in "+spec.SecretsDir,
				"%s could not be placed in sandbox %s: %s", s, key.ContainerName(), helperFailure(res, diag.Bytes(), s.Value))
		}
	}
	return remove, nil
}

// removeSecrets runs `sandkeep-agent rm-file PATH...` in sb, under its own timeout even when ctx was cancelled.
// It never ensures a sandbox: one that is gone took its tmpfs with it. Anything that leaves the files possibly
// in place recycles the sandbox instead, before the gate is released: its secrets must not outlive the command.
func (m *Manager) removeSecrets(ctx context.Context, key identity.Key, sb *driver.Sandbox, paths []string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), secretRemoveTimeout)
	defer cancel()
	if cur := m.cached(key); cur == nil || cur.ID != sb.ID {
		// Recycled, recreated or removed during the command (a stopped sandbox is started again by ensure, and
		// a stop empties a tmpfs): the files are gone with the tmpfs they were on.
		m.cfg.Logger.Debug("secret files gone with their sandbox", "key", key.Short(), "sandbox", sb.Name)
		return
	}
	var diag bytes.Buffer
	req := ExecRequest{
		Argv:   append([]string{driver.AgentPath, "rm-file"}, paths...),
		Stdout: &diag, Stderr: &diag, StdoutLimit: helperOutputLimit, StderrLimit: helperOutputLimit,
		Timeout: secretRemoveTimeout,
	}
	preq, err := m.agentRequest(req)
	if err == nil {
		var res *ExecResult
		res, err = m.execIn(ctx, key, sb, preq, driver.Output{Stdout: req.Stdout, Stderr: req.Stderr})
		if err == nil && (res.ExitCode != 0 || res.TimedOut || res.StartError != "") {
			err = errors.New(helperFailure(res, diag.Bytes(), nil))
		}
	}
	switch {
	case err == nil:
		return
	case cerrdefs.IsNotFound(err) || errors.Is(err, errNotStarted):
		return // the container is gone (errNotStarted: execChannel recycled it)
	}
	if cur := m.cached(key); cur == nil || cur.ID != sb.ID {
		return // a broken channel already recycled it
	}
	m.recycle(ctx, key, sb, fmt.Errorf("secret files not removed: %w", err))
}

// execIn runs preq in sb as it is, without ensuring it and without retrying: over the agent channel when this
// process has it up, else the engine's exec. It emits no event of its own.
func (m *Manager) execIn(ctx context.Context, key identity.Key, sb *driver.Sandbox, preq agentproto.Request,
	out driver.Output) (*ExecResult, error) {
	l, _ := m.channelFor(key, sb)
	conn, err := m.takeChannel(ctx, l, false)
	if err != nil {
		return nil, err
	}
	if conn != nil {
		return m.execChannel(ctx, key, sb, l, conn, preq, out)
	}
	res, err := m.drv.Exec(ctx, sb, preq, out)
	if errors.Is(err, agentproto.ErrProtocol) {
		m.recycle(ctx, key, sb, err)
		return nil, errNotStarted
	}
	if err != nil {
		return nil, err
	}
	return &ExecResult{Result: res, Sandbox: sb.Clone(), Transport: TransportExec}, nil
}

// helperOutputLimit bounds what is kept of a file command's output: a one-line diagnostic.
const helperOutputLimit = 4 << 10

// helperFailure says in one line why a file command failed. What the agent printed is data from the sandbox:
// it is cut to one printable line, and withheld entirely if it contains the secret's value.
func helperFailure(res *ExecResult, diag, value []byte) string {
	msg := strings.TrimSpace(string(diag))
	if len(value) > 0 && bytes.Contains(diag, value) {
		msg = "(the agent's message was withheld)"
	}
	msg = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, msg)
	if len(msg) > 300 {
		msg = msg[:300] + "..."
	}
	switch {
	case res.StartError != "":
		return "the agent could not start put-file/rm-file: " + res.StartError
	case res.TimedOut:
		return "the agent's file command timed out"
	case msg == "":
		return fmt.Sprintf("the agent's file command exited %d", res.ExitCode)
	}
	return msg
}
