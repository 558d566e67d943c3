package reaper

import (
	"errors"

	"github.com/containerd/errdefs"
)

func isNotFound(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }
