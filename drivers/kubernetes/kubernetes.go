// Package kubernetes offers sandkeep's Kubernetes driver to a library Manager (sandkeep.Config.Drivers): one
// restricted pod, a record and a workspace claim per key in one namespace (docs/KUBERNETES.md). It is a package
// of its own so that only a program that offers it links client-go.
package kubernetes

import (
	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/engine"
)

// FromEnv offers the cluster KUBECONFIG (or the in-cluster config) names, in the namespace and with the agent
// image the environment gives (SANDKEEP_KUBE_NAMESPACE, SANDKEEP_KUBE_AGENT_IMAGE, SANDKEEP_KUBE_STORAGE_CLASS,
// SANDKEEP_KUBE_WORKSPACE_SIZE). The cluster is reached when admission first needs the driver.
func FromEnv() sandkeep.DriverOption {
	return engine.DriverOption{Name: "kubernetes", New: func(engine.DriverEnv) (engine.Driver, error) {
		return kube.New(kube.FromEnv())
	}}
}
