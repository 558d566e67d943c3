package api

import (
	"net/http/httptest"
	"testing"
)

// TestE2BSandboxID: the E2B sandbox a request names, which a fleet hands to the replica holding it.
func TestE2BSandboxID(t *testing.T) {
	for _, tc := range []struct{ method, path, header, want string }{
		{"GET", "/e2b/sandboxes/i1ab2", "", "i1ab2"},
		{"POST", "/e2b/sandboxes/i1ab2/timeout", "", "i1ab2"},
		{"POST", "/e2b/v2/sandboxes/i1ab2/connect", "", "i1ab2"},
		{"GET", "/e2b/envd/files", "i9zz", "i9zz"},
		{"POST", "/e2b/envd/process.Process/Start", "i9zz", "i9zz"},
		{"POST", "/e2b/v2/sandboxes", "", ""},
		{"GET", "/e2b/sandboxes", "", ""},
		{"GET", "/e2b/snapshots", "", ""},
		{"GET", "/e2b/envd/health", "", ""},
	} {
		r := httptest.NewRequest(tc.method, tc.path, nil)
		if tc.header != "" {
			r.Header.Set("E2b-Sandbox-Id", tc.header)
		}
		if got := e2bSandboxID(r); got != tc.want {
			t.Errorf("%s %s: sandbox %q, want %q", tc.method, tc.path, got, tc.want)
		}
	}
}
