package feature_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/devcontainer/feature"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/testutil/ocireg"
)

// TestRegistryFetch: a feature pushed to a distribution registry on 127.0.0.1, which the operator allowlisted,
// is fetched with its files and the manifest's digest; a missing tag and an unreachable registry fail as
// FEATURE_UNAVAILABLE naming the feature and the registry.
func TestRegistryFetch(t *testing.T) {
	host := ocireg.Registry(t)
	reg := &feature.Registry{Allow: []string{host, "127.0.0.1"}}
	id := host + "/features/hello:1"
	dg := ocireg.PushFeature(t, id, map[string]string{
		"devcontainer-feature.json": `{"id": "hello", "version": "1.0.0", "options": {"greeting": {"type": "string", "default": "hi"}}}`,
		"install.sh":                "#!/bin/sh\necho installed\n",
		"bin/tool":                  "payload",
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fs, err := feature.Resolve(ctx, feature.Source{DcDir: ".devcontainer", Fetcher: reg}, []feature.Requested{{ID: id, Options: []byte(`{"greeting": "hello"}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 1 || fs[0].Digest != dg || fs[0].Options["GREETING"] != "hello" || len(fs[0].Files) != 3 {
		t.Fatalf("feature = %+v, want digest %s and three files", fs[0], dg)
	}
	for _, f := range fs[0].Files {
		if f.Path == "install.sh" && f.Mode&0o100 == 0 {
			t.Errorf("install.sh mode %v lost its exec bit", f.Mode)
		}
	}
	pinned := host + "/features/hello@" + dg
	if _, err := feature.Resolve(ctx, feature.Source{Fetcher: reg}, []feature.Requested{{ID: pinned}}); err != nil {
		t.Errorf("by digest: %v", err)
	}

	_, err = feature.Resolve(ctx, feature.Source{Fetcher: reg}, []feature.Requested{{ID: host + "/features/hello:2"}})
	if fault.CodeOf(err) != fault.FeatureUnavailable || !strings.Contains(err.Error(), "hello:2") {
		t.Errorf("missing tag: err = %v, want FEATURE_UNAVAILABLE naming the feature", err)
	}

	// A registry that is not there: a loopback port nothing listens on (taken, then closed).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	_, err = feature.Resolve(ctx, feature.Source{Fetcher: reg}, []feature.Requested{{ID: gone + "/features/go:1"}})
	var fe *fault.Error
	if fault.CodeOf(err) != fault.FeatureUnavailable || !strings.Contains(err.Error(), gone+"/features/go:1") ||
		!strings.Contains(err.Error(), "registry "+gone) {
		t.Fatalf("unreachable: err = %v, want FEATURE_UNAVAILABLE naming the feature and the registry", err)
	}
	if _ = fe; !strings.Contains(err.Error(), "vendor the feature") {
		t.Errorf("unreachable: no hint: %v", err)
	}
}
