package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// Options.Seccomp's values.
const (
	SeccompRuntimeDefault = "runtime-default"
	SeccompLocalhost      = "localhost"
)

// SeccompLocalhostProfile is where sandkeep's seccomp profile (driver.SeccompProfile) is installed on a node,
// relative to the kubelet's seccomp directory (/var/lib/kubelet/seccomp by default): named by its content, so
// a node that has another version's file fails the pod rather than running it under a profile nobody chose.
func SeccompLocalhostProfile() string {
	sum := sha256.Sum256([]byte(driver.SeccompProfile()))
	return "sandkeep/seccomp-" + hex.EncodeToString(sum[:6]) + ".json"
}

// checkSeccomp refuses an Options.Seccomp that is neither value.
func checkSeccomp(v string) error {
	switch v {
	case "", SeccompRuntimeDefault, SeccompLocalhost:
		return nil
	}
	return fault.New(fault.InvalidArgument, EnvSeccomp+"=localhost (with the profile installed on the nodes) or runtime-default",
		"%s %q is neither localhost nor runtime-default", EnvSeccomp, v)
}

// seccomp is the Localhost profile podFor gives sandbox pods, "" for the runtime's default.
func (d *Driver) seccomp() string {
	if d.opts.Seccomp == SeccompLocalhost {
		return SeccompLocalhostProfile()
	}
	return ""
}

// Hardening is what doctor reports of the kubernetes driver's kernel-facing bounds.
type Hardening struct {
	Seccomp string // the Localhost profile's path, "" for RuntimeDefault
	// PodPidsLimit is each node's kubelet podPidsLimit (-1 or 0: none), read from the node's /configz through
	// the API server (needs get on nodes/proxy); PidsErr says why it could not be read.
	PodPidsLimit map[string]int64
	PidsErr      error
}

// Hardening reads the seccomp mode and the nodes' pod pids limits. A pod's pids are bounded only by the
// kubelet's podPidsLimit: the pod API has no field for it.
func (d *Driver) Hardening(ctx context.Context) Hardening {
	h := Hardening{Seccomp: d.seccomp(), PodPidsLimit: map[string]int64{}}
	nodes, err := d.api.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		h.PidsErr = fmt.Errorf("list nodes: %w", err)
		return h
	}
	for _, n := range nodes.Items {
		raw, err := d.api.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", n.Name, "proxy", "configz").DoRaw(ctx)
		if err != nil {
			h.PidsErr = fmt.Errorf("node %s's kubelet configuration: %w", n.Name, err)
			return h
		}
		var cz struct {
			KubeletConfig struct {
				PodPidsLimit *int64 `json:"podPidsLimit"`
			} `json:"kubeletconfig"`
		}
		if err := json.Unmarshal(raw, &cz); err != nil {
			h.PidsErr = fmt.Errorf("node %s's kubelet configuration: %w", n.Name, err)
			return h
		}
		limit := int64(-1)
		if cz.KubeletConfig.PodPidsLimit != nil {
			limit = *cz.KubeletConfig.PodPidsLimit
		}
		h.PodPidsLimit[n.Name] = limit
	}
	return h
}
