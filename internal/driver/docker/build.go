package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	cerrdefs "github.com/containerd/errdefs"
	apibuild "github.com/moby/moby/api/types/build"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/build"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// imageBuilder is the Docker call Build makes beyond engine; *client.Client has it. It is found on d.api by
// type assertion so that stand-ins for engine need not implement it.
type imageBuilder interface {
	ImageBuild(ctx context.Context, buildContext io.Reader, opts client.ImageBuildOptions) (client.ImageBuildResult, error)
}

var _ imageBuilder = (*client.Client)(nil)

// buildNetworkMode: RUN steps of a build get no network at all. Fetching dependencies belongs in post_create,
// which runs under the sandbox's network policy.
const buildNetworkMode = "none"

// Bounds of a build's RUN steps, the same as a sandbox's defaults: a Dockerfile cannot take the host's memory or
// every CPU. The classic builder applies them to each intermediate container.
const (
	buildMemoryBytes = 2 << 30
	buildCPUPeriod   = 100_000 // µs
	buildCPUQuota    = 100_000 // one CPU
)

const hintBuild = "read the build output above, fix the Dockerfile, and run again"

// Build builds req's image with the classic builder, or returns the image already built from the very same
// inputs (tag build.Tag(digest) carrying label build.LabelDigest=digest). The base image is never re-pulled when
// present (PullParent false); a base image that is absent is pulled by the daemon, as `docker build` does.
// RUN steps run with network mode "none", 2 GiB of memory (no swap), one CPU, nofile 8192 and no core files, and
// together under a cgroup with pids.max 512 where the engine allows one (BuildLimits); a Dockerfile that would reach
// a network anyway (ADD <url>, RUN --network) is refused before the daemon is called (build.CheckDockerfile).
// Intermediate containers are removed, even on failure.
//
// progress receives the daemon's output as plain lines (nil: discard); a failing progress writer does not stop
// the build. ctx bounds everything, including the upload of the context; when ctx ends the HTTP request is
// cancelled (the daemon stops the build) and the error wraps ctx's cause.
//
// Errors: build.CodeContextInvalid (from build.Context, before the daemon is called), build.CodeFailed (the
// daemon refused or the build failed: the message carries the daemon's error line), or ctx's cause.
func (d *Driver) Build(ctx context.Context, req build.Request, progress io.Writer) (imageRef, imageID string, err error) {
	b, ok := d.api.(imageBuilder)
	if !ok {
		return "", "", errors.New("build: the engine client cannot build images")
	}
	if progress == nil {
		progress = io.Discard
	}
	out := &lenientWriter{w: progress}

	tarball, dockerfile, digest, err := build.Context(ctx, req)
	if err != nil {
		return "", "", err
	}
	defer tarball.Close()
	ref := build.Tag(digest)

	if id, ok, err := d.builtImage(ctx, ref, digest); err != nil {
		return "", "", err
	} else if ok {
		fmt.Fprintf(out, "Using image %s, already built from these inputs\n", ref)
		return ref, id, nil
	}

	_, cg := d.buildLimits(ctx)
	cgroupParent, removeCgroup, err := cg.make()
	if err != nil {
		return "", "", fault.Wrap(err, build.CodeFailed, "check that sandkeep runs as root on the engine's host, or see `sandkeep doctor`'s build limits",
			"cannot bound the build's processes: %v", err)
	}
	defer removeCgroup()

	args := make(map[string]*string, len(req.Args))
	for k, v := range req.Args {
		args[k] = &v
	}
	res, err := b.ImageBuild(ctx, tarball, client.ImageBuildOptions{
		Tags:        []string{ref},
		Dockerfile:  dockerfile,
		BuildArgs:   args,
		Target:      req.Target,
		Labels:      map[string]string{build.LabelDigest: digest},
		Remove:      true,
		ForceRemove: true,
		PullParent:  false,
		NetworkMode: buildNetworkMode,
		Memory:      buildMemoryBytes,
		MemorySwap:  buildMemoryBytes,
		CPUPeriod:   buildCPUPeriod,
		CPUQuota:    buildCPUQuota,
		// The processes of all its RUN steps together, and the sandbox's nofile and core ulimits
		// (buildlimits.go; issue 22, finding 3).
		CgroupParent: cgroupParent,
		Ulimits:      buildUlimits(),
		Version:      apibuild.BuilderV1,
	})
	if err != nil {
		if ctx.Err() != nil {
			return "", "", fmt.Errorf("build %s: %w", ref, context.Cause(ctx))
		}
		return "", "", fault.Wrap(err, build.CodeFailed, "check `docker info` and the daemon log",
			"the Docker daemon refused the build: %v", err)
	}
	defer res.Body.Close()
	if err := readBuildProgress(res.Body, out); err != nil {
		if ctx.Err() != nil {
			return "", "", fmt.Errorf("build %s: %w", ref, context.Cause(ctx))
		}
		return "", "", err
	}

	id, ok, err := d.builtImage(ctx, ref, digest)
	if err != nil {
		return "", "", err
	}
	if !ok {
		return "", "", fault.New(build.CodeFailed, hintBuild, "the build of %s finished without producing the image", ref)
	}
	return ref, id, nil
}

// builtImage returns the ID of ref when it exists and was built from digest.
func (d *Driver) builtImage(ctx context.Context, ref, digest string) (string, bool, error) {
	img, err := d.api.ImageInspect(ctx, ref)
	if cerrdefs.IsNotFound(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("inspect image %s: %w", ref, err)
	}
	if img.Config == nil || img.Config.Labels[build.LabelDigest] != digest {
		return "", false, nil // the tag was moved to another image: build again, which takes the tag back
	}
	return img.ID, true, nil
}

// buildMessage is one JSON message of the daemon's build stream.
type buildMessage struct {
	Stream      string `json:"stream"`
	Status      string `json:"status"`
	Progress    string `json:"progress"`
	Error       string `json:"error"` // deprecated by the engine, still sent by old ones
	ErrorDetail *struct {
		Message string `json:"message"`
	} `json:"errorDetail"`
}

// readBuildProgress copies the stream's text to out until the stream ends, and returns the build's error, if the
// daemon reported one, as a *fault.Error with build.CodeFailed.
func readBuildProgress(body io.Reader, out io.Writer) error {
	dec := json.NewDecoder(body)
	for {
		var msg buildMessage
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fault.Wrap(err, build.CodeFailed, "check the daemon log", "the build's progress stream broke: %v", err)
		}
		if msg.Stream != "" {
			_, _ = io.WriteString(out, msg.Stream)
		}
		if msg.Status != "" {
			line := msg.Status
			if msg.Progress != "" {
				line += " " + msg.Progress
			}
			_, _ = io.WriteString(out, line+"\n")
		}
		text := msg.Error
		if msg.ErrorDetail != nil && msg.ErrorDetail.Message != "" {
			text = msg.ErrorDetail.Message
		}
		if text != "" {
			_, _ = io.WriteString(out, text+"\n")
			return fault.Wrap(errors.New(text), build.CodeFailed, hintBuild, "the image build failed: %s", text)
		}
	}
}

// lenientWriter stops writing to w after its first error and reports success, so a display that goes away
// (a closed terminal, a full pipe) does not fail the build.
type lenientWriter struct {
	w      io.Writer
	broken bool
}

func (l *lenientWriter) Write(p []byte) (int, error) {
	if !l.broken {
		if _, err := l.w.Write(p); err != nil {
			l.broken = true
		}
	}
	return len(p), nil
}
