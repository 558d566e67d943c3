package devcontainer

import (
	"slices"
	"testing"
)

func TestFeaturesRecorded(t *testing.T) {
	cfg, list := parse(t, `{"image": "debian:12",
		// features, as real files write them
		"features": {"ghcr.io/devcontainers/features/go:1": {"version": "1.22",}, "./local": {}, "ghcr.io/x/node:1": "lts"}}`)
	only(t, list)
	want := []FeatureRequest{
		{ID: "ghcr.io/devcontainers/features/go:1", Options: []byte(`{"version":"1.22"}`)},
		{ID: "./local", Options: []byte(`{}`)},
		{ID: "ghcr.io/x/node:1", Options: []byte(`"lts"`)},
	}
	if !slices.EqualFunc(cfg.Features, want, func(a, b FeatureRequest) bool { return a.ID == b.ID && string(a.Options) == string(b.Options) }) {
		t.Errorf("features = %q, want %q", cfg.Features, want)
	}
	_, list = parse(t, `{"image": "debian:12", "features": ["ghcr.io/x/go:1"]}`)
	only(t, list, "SK207")
}
