package kube

import (
	"io"

	"github.com/sandkeep/sandkeep/internal/ociimage"
)

// WriteAgentImage writes the agent image the driver's init container expects (SANDKEEP_KUBE_AGENT_IMAGE): FROM
// scratch, the static agent at /sandkeep-agent and nothing else, entrypoint "sandkeep-agent init" (so the same
// image can serve as a node's pod sandbox image), as an OCI archive tagged ref.
func WriteAgentImage(w io.Writer, agent []byte, ref string) (ociimage.Result, error) {
	return ociimage.Write(w, ociimage.Image{
		Ref:        ref,
		Files:      []ociimage.File{{Path: agentImagePath, Mode: 0o555, Data: agent}},
		Entrypoint: []string{agentImagePath, "init"},
		Labels:     map[string]string{"io.sandkeep.agent": "true"},
	})
}
