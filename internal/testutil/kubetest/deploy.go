package kubetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// The namespaces deploy/kubernetes names, which the tests rename to their own.
const (
	DeploySystemNS  = "sandkeep-system"
	DeploySandboxNS = "sandkeep"
)

// DeployDir is deploy/kubernetes of this module.
func DeployDir(t testing.TB) string {
	t.Helper()
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy", "kubernetes")
}

// Manifests decodes every YAML document of the named files under dir (every *.yaml when none is named),
// namespaces first, then service accounts and roles, then the rest.
func Manifests(t testing.TB, dir string, files ...string) []*unstructured.Unstructured {
	t.Helper()
	if len(files) == 0 {
		all, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
		if err != nil || len(all) == 0 {
			t.Fatalf("no manifests in %s (%v)", dir, err)
		}
		files = all
	} else {
		for i, f := range files {
			files[i] = filepath.Join(dir, f)
		}
	}
	var out []*unstructured.Unstructured
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			var obj map[string]any
			err := dec.Decode(&obj)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if obj == nil {
				continue
			}
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return rank(out[i]) < rank(out[j]) })
	return out
}

func rank(u *unstructured.Unstructured) int {
	switch u.GetKind() {
	case "Namespace":
		return 0
	case "ServiceAccount", "Role", "ClusterRole":
		return 1
	default:
		return 2
	}
}

// Rename points the manifests at the test's namespaces, sys for sandkeep-system and sb for sandkeep, the
// way an operator who picks other names edits them (and gives cluster-wide objects names of the test's).
func Rename(t testing.TB, objs []*unstructured.Unstructured, sys, sb string) {
	t.Helper()
	nsMap := map[string]string{DeploySystemNS: sys, DeploySandboxNS: sb}
	for _, u := range objs {
		if u.GetKind() == "Namespace" {
			if n, ok := nsMap[u.GetName()]; ok {
				u.SetName(n)
			}
		}
		if n, ok := nsMap[u.GetNamespace()]; ok {
			u.SetNamespace(n)
		}
		switch u.GetKind() {
		case "StorageClass", "ClusterRole", "ClusterRoleBinding":
			u.SetName(sys + "-" + u.GetName())
		}
		b, err := json.Marshal(u.Object)
		if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if err := json.Unmarshal(b, &obj); err != nil {
			t.Fatal(err)
		}
		walkRename(obj, nsMap)
		u.Object = obj
	}
}

// walkRename maps the namespace names inside an object: subjects' namespaces, a rule's resourceNames of
// namespaces, the value of SANDKEEP_KUBE_NAMESPACE, a NetworkPolicy's namespaceSelector by name.
func walkRename(v any, nsMap map[string]string) {
	switch x := v.(type) {
	case map[string]any:
		if ns, ok := x["namespace"].(string); ok && nsMap[ns] != "" {
			if _, subject := x["kind"]; subject {
				x["namespace"] = nsMap[ns]
			}
		}
		if name, _ := x["name"].(string); name == kube.EnvNamespace {
			if val, ok := x["value"].(string); ok && nsMap[val] != "" {
				x["value"] = nsMap[val]
			}
		}
		if res, ok := x["resources"].([]any); ok && slices.Contains(res, any("namespaces")) {
			if names, ok := x["resourceNames"].([]any); ok {
				for i, n := range names {
					if s, _ := n.(string); nsMap[s] != "" {
						names[i] = nsMap[s]
					}
				}
			}
		}
		if sel, ok := x["namespaceSelector"].(map[string]any); ok {
			if labels, ok := sel["matchLabels"].(map[string]any); ok {
				if s, _ := labels["kubernetes.io/metadata.name"].(string); nsMap[s] != "" {
					labels["kubernetes.io/metadata.name"] = nsMap[s]
				}
			}
		}
		for _, e := range x {
			walkRename(e, nsMap)
		}
	case []any:
		for _, e := range x {
			walkRename(e, nsMap)
		}
	}
}

// Resource is the dynamic client of u's kind, in u's namespace when it has one.
func (c *Cluster) Resource(u *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	c.mapperOnce.Do(func() {
		c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.API.Discovery()))
		c.dyn, c.dynErr = dynamic.NewForConfig(c.Config)
	})
	if c.dynErr != nil {
		return nil, c.dynErr
	}
	m, err := c.mapper.RESTMapping(u.GroupVersionKind().GroupKind(), u.GroupVersionKind().Version)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
	}
	if ns := u.GetNamespace(); ns != "" {
		return c.dyn.Resource(m.Resource).Namespace(ns), nil
	}
	return c.dyn.Resource(m.Resource), nil
}

// Apply applies u for real with server-side apply (created, or made to match when it exists: the driver may
// have made a namespace already), fields validated strictly.
func (c *Cluster) Apply(ctx context.Context, u *unstructured.Unstructured) error {
	ri, err := c.Resource(u)
	if err != nil {
		return err
	}
	b, err := json.Marshal(u.Object)
	if err != nil {
		return err
	}
	force := true
	_, err = ri.Patch(ctx, u.GetName(), types.ApplyPatchType, b, metav1.PatchOptions{FieldManager: "sandkeep-test", Force: &force,
		FieldValidation: "Strict"})
	if err != nil {
		return fmt.Errorf("apply %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// ImportImage imports the OCI archive tar into the node's containerd under repo (the way every test image gets
// onto the node: there is no registry).
func (c *Cluster) ImportImage(ctx context.Context, repo string, tar io.Reader) error {
	socket := os.Getenv(EnvContainerd)
	if socket == "" {
		socket = NodeContainerd
	}
	cmd := exec.CommandContext(ctx, "ctr", "-a", socket, "-n", "k8s.io", "images", "import", "--digests", "--base-name", repo, "-")
	cmd.Stdin = tar
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ctr images import %s: %v: %s", repo, err, out)
	}
	return nil
}
