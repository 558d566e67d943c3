package reaper

import (
	"context"
	"fmt"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/build"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
)

// dockerAPI is the part of the Docker Engine API the Docker source calls.
type dockerAPI interface {
	ContainerList(ctx context.Context, opts client.ContainerListOptions) (client.ContainerListResult, error)
	ContainerRemove(ctx context.Context, id string, opts client.ContainerRemoveOptions) (client.ContainerRemoveResult, error)
	VolumeList(ctx context.Context, opts client.VolumeListOptions) (client.VolumeListResult, error)
	VolumeRemove(ctx context.Context, id string, opts client.VolumeRemoveOptions) (client.VolumeRemoveResult, error)
	ImageList(ctx context.Context, opts client.ImageListOptions) (client.ImageListResult, error)
	ImageRemove(ctx context.Context, id string, opts client.ImageRemoveOptions) (client.ImageRemoveResult, error)
}

// Kinds the Docker source lists.
const (
	KindContainer = "container"
	KindCompanion = "companion"
	KindVolume    = "volume"
	KindImage     = "image"
)

// DefaultImageGrace: a build image no container uses is removed once it is this old (it is a cache: the next
// sandbox of the same build inputs rebuilds it).
const DefaultImageGrace = 7 * 24 * time.Hour

// Docker is the Source of a Docker engine's sandboxes: every container that carries an installation label,
// whichever installation's (Decide keeps the others'); and the compose companions and their named volumes whose
// sandbox container is gone (a removal that died half-way, or the reaper's own removal of the sandbox: the next
// round sees them). A companion names its sandbox (docker.LabelCompanionOf) but no installation: a sandbox's name
// is its key's on this engine, so "its sandbox is gone" is judged by name, whichever installation made it.
// Build images (build.Tag, labelled build.LabelDigest) are a cache shared by every installation on the engine:
// one that no container uses and that is older than ImageGrace is removed. Sandkeep makes no per-key networks on
// Docker (a sandbox has network mode none; companions join the sandbox's namespace), so there are none to reap.
type Docker struct {
	API dockerAPI
	// ImageGrace is DefaultImageGrace when 0; negative: none.
	ImageGrace time.Duration
	// onlyDigest, in tests, limits the build images judged to the one of this digest (the engine is shared).
	onlyDigest string
}

var _ Source = Docker{}

// List implements Source.
func (d Docker) List(ctx context.Context) ([]Resource, error) {
	all, err := d.API.ContainerList(ctx, client.ContainerListOptions{All: true})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	names := map[string]bool{}   // every container's name: a companion's sandbox stands when its name is here
	serving := map[string]bool{} // sandbox names with a companion
	var out []Resource
	used := map[string]bool{} // image IDs some container was made from
	for _, c := range all.Items {
		used[c.ImageID] = true
		name := c.ID
		if len(c.Names) > 0 {
			name = strings.TrimPrefix(c.Names[0], "/")
		}
		names[name] = true
		if of := c.Labels[docker.LabelCompanionOf]; of != "" {
			serving[of] = true
		}
		if _, ok := c.Labels[driver.LabelInstallation]; ok {
			out = append(out, Resource{Kind: KindContainer, Name: name, ID: c.ID, Labels: c.Labels, State: string(c.State)})
		}
	}
	for _, c := range all.Items {
		of := c.Labels[docker.LabelCompanionOf]
		if of == "" {
			continue
		}
		r := Resource{Kind: KindCompanion, Name: strings.TrimPrefix(firstName(c.Names, c.ID), "/"), ID: c.ID, Keyless: true,
			State: string(c.State), ReapRunning: true} // a companion lives in its sandbox's namespace: gone with it
		if names[of] {
			r.Hold = ReasonInUse
		}
		out = append(out, r)
	}
	vols, err := d.API.VolumeList(ctx, client.VolumeListOptions{Filters: client.Filters{}.Add("label", docker.LabelCompanionOf)})
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	for _, v := range vols.Items {
		of := v.Labels[docker.LabelCompanionOf]
		r := Resource{Kind: KindVolume, Name: v.Name, ID: v.Name, Keyless: true}
		if names[of] || serving[of] {
			r.Hold = ReasonInUse
		}
		out = append(out, r)
	}
	images, err := d.images(ctx, used)
	if err != nil {
		return nil, err
	}
	return append(out, images...), nil
}

// images are the build images, each held while a container uses it or while it is younger than the grace.
func (d Docker) images(ctx context.Context, used map[string]bool) ([]Resource, error) {
	label := build.LabelDigest
	if d.onlyDigest != "" {
		label += "=" + d.onlyDigest
	}
	imgs, err := d.API.ImageList(ctx, client.ImageListOptions{All: true, Filters: client.Filters{}.Add("label", label)})
	if err != nil {
		return nil, fmt.Errorf("list build images: %w", err)
	}
	grace := DefaultImageGrace
	if d.ImageGrace != 0 {
		grace = max(d.ImageGrace, 0)
	}
	var out []Resource
	for _, img := range imgs.Items {
		r := Resource{Kind: KindImage, Name: firstName(img.RepoTags, img.ID), ID: img.ID, Keyless: true}
		switch {
		case used[img.ID]:
			r.Hold = ReasonInUse
		case time.Since(time.Unix(img.Created, 0)) < grace:
			r.Hold = ReasonRecent
		}
		out = append(out, r)
	}
	return out, nil
}

func firstName(names []string, id string) string {
	if len(names) > 0 {
		return names[0]
	}
	return id
}

// Remove implements Source: a sandbox container and its anonymous volumes (not forced: one that runs again
// stays); a companion forced (its sandbox is gone); a companion's volume.
func (d Docker) Remove(ctx context.Context, r Resource) error {
	var err error
	switch r.Kind {
	case KindContainer:
		_, err = d.API.ContainerRemove(ctx, r.ID, client.ContainerRemoveOptions{RemoveVolumes: true})
	case KindCompanion:
		_, err = d.API.ContainerRemove(ctx, r.ID, client.ContainerRemoveOptions{RemoveVolumes: true, Force: true})
	case KindVolume:
		_, err = d.API.VolumeRemove(ctx, r.ID, client.VolumeRemoveOptions{})
	case KindImage: // not forced: a container made from it meanwhile keeps it (a conflict, reported)
		_, err = d.API.ImageRemove(ctx, r.ID, client.ImageRemoveOptions{})
	default:
		return fmt.Errorf("reap %s %s: not a kind this source lists", r.Kind, r.Name)
	}
	if err != nil && !cerrdefs.IsNotFound(err) {
		return err
	}
	return nil
}
