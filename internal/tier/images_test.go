package tier

import (
	"testing"

	"github.com/sandkeep/sandkeep/internal/diag"
)

// TestImageRegistry: an image's registry is the one its normalized name says (docker.io for a short name), and
// it is allowed only when image_registries lists it, by host:port or by host for any port, without case.
func TestImageRegistry(t *testing.T) {
	op := Operator{ImageRegistries: []string{"Registry.Example", "127.0.0.1:5000", "docker.io"}}
	for _, tc := range []struct {
		ref, registry string
		allowed       bool
	}{
		{"alpine:3", "docker.io", true},
		{"library/alpine", "docker.io", true},
		{"registry.example/team/img:1", "registry.example", true},
		{"registry.example:8443/team/img", "registry.example:8443", true},
		{"127.0.0.1:5000/x@sha256:" + sha, "127.0.0.1:5000", true},
		{"127.0.0.1:5001/x:1", "127.0.0.1:5001", false},
		{"localhost/x:1", "localhost", false},
		{"169.254.169.254/x", "169.254.169.254", false},
		{"ghcr.io/o/x:1", "ghcr.io", false},
		{"Not A Ref", "", false},
	} {
		reg, ok := op.ImageRegistry(tc.ref)
		if reg != tc.registry || ok != tc.allowed {
			t.Errorf("ImageRegistry(%q) = %q, %v; want %q, %v", tc.ref, reg, ok, tc.registry, tc.allowed)
		}
	}
	if _, ok := (Operator{}).ImageRegistry("alpine"); ok {
		t.Error("the zero Operator allows Docker Hub")
	}
	list := Operator{ImageRegistries: []string{"ghcr.io", "", "ghcr.io/o", "a b"}}.Validate()
	var fields []string
	for _, d := range list {
		if d.Code == diag.TierOperatorInvalid && d.Severity == diag.Error {
			fields = append(fields, d.Field)
		}
	}
	if len(fields) != 3 || fields[0] != "image_registries[1]" || fields[2] != "image_registries[3]" {
		t.Errorf("invalid image_registries: %v", fields)
	}
}

const sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
