package kube

import (
	"errors"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestLocalImage: an image is local when a node lists it, by tag or by digest; a digest-pinned ref no node has
// is not (the kubelet would pull it, from whatever registry it names), nor is any image when the driver may
// not list the nodes: a caller that refuses absent repository images refuses it then (issue 22, finding 6).
func TestLocalImage(t *testing.T) {
	const dg = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Images: []corev1.ContainerImage{
		{Names: []string{"docker.io/library/tool:1", "docker.io/library/tool@" + dg}},
		{Names: []string{"registry.example/team/bare:2"}},
	}}}
	d := &Driver{opts: Options{Namespace: "ns"}, api: kubefake.NewClientset(node)}
	for _, tc := range []struct{ ref, want string }{
		{"tool:1", "docker.io/library/tool@" + dg},
		{"docker.io/library/tool@" + dg, "docker.io/library/tool@" + dg},
		{"registry.example/team/bare:2", "registry.example/team/bare:2"},
		{"tool:2", ""},
		{"127.0.0.1:5000/tool@" + dg, ""},
	} {
		got, err := d.LocalImage(t.Context(), tc.ref)
		if tc.want == "" {
			if !errors.Is(err, cerrdefs.ErrNotFound) {
				t.Errorf("LocalImage(%q) = %q, %v; want ErrNotFound", tc.ref, got, err)
			}
		} else if got != tc.want || err != nil {
			t.Errorf("LocalImage(%q) = %q, %v; want %q", tc.ref, got, err, tc.want)
		}
	}
	api := kubefake.NewClientset(node)
	api.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("nodes"), "", errors.New("no"))
	})
	d = &Driver{opts: Options{Namespace: "ns"}, api: api}
	if _, err := d.LocalImage(t.Context(), "tool:1"); !errors.Is(err, cerrdefs.ErrNotFound) {
		t.Errorf("nodes not listable: %v, want ErrNotFound", err)
	}
}
