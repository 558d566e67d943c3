package main

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/ociimage"
)

// DefaultAgentImageTag is the tag `sandkeep agent image` gives the image unless --tag says otherwise.
const defaultAgentImageTag = "docker.io/library/sandkeep-agent:dev"

func newAgent(g *globals) *cobra.Command {
	agent := &cobra.Command{Use: "agent", Short: "The in-sandbox agent: package it for clusters"}
	var out, tag string
	image := &cobra.Command{
		Use:   "image --out FILE",
		Short: "Write the agent image (FROM scratch, the static agent only) as an OCI archive",
		Long: `Write the agent image as an OCI image archive (which also carries Docker's manifest.json): FROM scratch,
with only the static sandkeep-agent at /sandkeep-agent, entrypoint "sandkeep-agent init". The kubernetes
driver copies the agent from it into every sandbox pod (SANDKEEP_KUBE_AGENT_IMAGE names it). Load it into a
node with 'ctr -n k8s.io images import FILE', or push it to a registry (skopeo copy oci-archive:FILE ...).`,
		Example: "  sandkeep agent image --out sandkeep-agent.tar --tag registry.example/sandkeep-agent:v1",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return fault.New(fault.InvalidArgument, "pass --out FILE", "sandkeep agent image needs --out")
			}
			path, err := agentBinary(g.agent)
			if err != nil {
				return err
			}
			res, err := writeAgentImage(path, tag, out)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "%s\t%s\tmanifest %s\n", out, tag, res.ManifestDigest)
			return nil
		},
	}
	image.Flags().StringVar(&out, "out", "", "file to write the OCI archive to")
	image.Flags().StringVar(&tag, "tag", defaultAgentImageTag, "the image's name and tag")
	agent.AddCommand(image)
	return agent
}

// agentBinary finds the agent as sandkeep does: --agent, else $SANDKEEP_AGENT, else next to sandkeep, else PATH.
func agentBinary(flag string) (string, error) {
	const hint = "build it with `CGO_ENABLED=0 go build -o bin/ ./cmd/sandkeep-agent` and pass --agent PATH"
	for _, p := range []string{flag, os.Getenv("SANDKEEP_AGENT")} {
		if p != "" {
			return p, nil
		}
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "sandkeep-agent")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("sandkeep-agent"); err == nil {
		return p, nil
	}
	return "", fault.New(fault.AgentMissing, hint, "the sandkeep-agent binary was not found next to sandkeep or on PATH")
}

func writeAgentImage(agentPath, tag, out string) (ociimage.Result, error) {
	const hint = "build it with `CGO_ENABLED=0 go build -o bin/ ./cmd/sandkeep-agent` and pass --agent PATH"
	data, err := os.ReadFile(agentPath)
	if err != nil {
		return ociimage.Result{}, fault.Wrap(err, fault.AgentMissing, hint, "cannot read the agent binary %s", agentPath)
	}
	if err := checkStatic(data); err != nil {
		return ociimage.Result{}, fault.Wrap(err, fault.AgentMissing, hint, "the agent binary %s cannot run FROM scratch (%v)", agentPath, err)
	}
	var buf bytes.Buffer
	res, err := kube.WriteAgentImage(&buf, data, tag)
	if err != nil {
		return ociimage.Result{}, fault.Wrap(err, fault.InvalidArgument, "give --tag as name:tag, e.g. sandkeep-agent:v1", "cannot write the agent image")
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return ociimage.Result{}, fmt.Errorf("write %s: %w", out, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		os.Remove(tmp)
		return ociimage.Result{}, fmt.Errorf("write %s: %w", out, err)
	}
	return res, nil
}

// checkStatic refuses a dynamically linked ELF binary (an image FROM scratch has no loader).
func checkStatic(data []byte) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("not an ELF binary: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (build it with CGO_ENABLED=0)")
		}
	}
	return nil
}
