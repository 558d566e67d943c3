package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fleet"
	"github.com/sandkeep/sandkeep/internal/store/postgres"
)

// TestFleetE2B: an E2B sandbox made through one replica (its record lives there) is reached through the other
// as through the first: the control plane (get, timeout, kill) and envd (an upload and a download) are handed to
// the replica that holds the sandbox's id (fleet.AliasE2B). Before, the other replica answered 404 / 401: it has
// no record of the sandbox.
func TestFleetE2B(t *testing.T) {
	c, reps, dsn := twoReplicas(t)
	tok := c.createToken(t, c.ten("fe2b"), "fe2b", "").Token
	maker, other := reps[0], reps[1]

	ans := maker.raw(t, "POST", "/e2b/v2/sandboxes", "", strings.NewReader(`{"templateID":"base","timeout":600}`),
		"X-API-KEY", tok, "Content-Type", "application/json")
	var sbx struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal([]byte(ans.body), &sbx); err != nil || ans.status != http.StatusCreated || sbx.SandboxID == "" {
		t.Fatalf("create: %d %s (%v)", ans.status, ans.body, err)
	}
	st, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if l, err := st.GetLease(t.Context(), fleet.AliasE2B(sbx.SandboxID)); err != nil || !l.Live ||
		!strings.Contains(maker.log.String(), "fleet replica "+l.Owner+",") {
		t.Fatalf("the sandbox's id is held by %+v (%v); want the replica that made it", l, err)
	}

	if got := other.raw(t, "GET", "/e2b/sandboxes/"+sbx.SandboxID, "", nil, "X-API-KEY", tok); got.status != http.StatusOK ||
		!strings.Contains(got.body, sbx.SandboxID) {
		t.Fatalf("get through the other replica: %d %s", got.status, got.body)
	}
	if got := other.raw(t, "POST", "/e2b/sandboxes/"+sbx.SandboxID+"/timeout", "", strings.NewReader(`{"timeout":900}`),
		"X-API-KEY", tok, "Content-Type", "application/json"); got.status != http.StatusNoContent {
		t.Fatalf("set timeout through the other replica: %d %s", got.status, got.body)
	}
	envd := []string{"E2b-Sandbox-Id", sbx.SandboxID, "X-Access-Token", sbx.EnvdAccessToken}
	if got := other.raw(t, "POST", "/e2b/envd/files?path=/home/user/via-other.txt", "", strings.NewReader("through the other replica\n"),
		append(envd, "Content-Type", "application/octet-stream")...); got.status != http.StatusOK {
		t.Fatalf("upload through the other replica: %d %s", got.status, got.body)
	}
	if got := maker.raw(t, "GET", "/e2b/envd/files?path=/home/user/via-other.txt", "", nil, envd...); got.status != http.StatusOK ||
		got.body != "through the other replica\n" {
		t.Fatalf("download through the maker: %d %q", got.status, got.body)
	}
	if got := other.raw(t, "GET", "/e2b/envd/files?path=/home/user/via-other.txt", "", nil, envd...); got.status != http.StatusOK ||
		got.body != "through the other replica\n" {
		t.Fatalf("download through the other replica: %d %q", got.status, got.body)
	}
	if got := other.raw(t, "DELETE", "/e2b/sandboxes/"+sbx.SandboxID, "", nil, "X-API-KEY", tok); got.status != http.StatusNoContent {
		t.Fatalf("kill through the other replica: %d %s", got.status, got.body)
	}
	if got := maker.raw(t, "GET", "/e2b/sandboxes/"+sbx.SandboxID, "", nil, "X-API-KEY", tok); got.status != http.StatusNotFound {
		t.Fatalf("get through the maker after the kill: %d %s; want 404", got.status, got.body)
	}
	if l, err := st.GetLease(t.Context(), fleet.AliasE2B(sbx.SandboxID)); err != nil || l.Live {
		t.Errorf("after the kill the sandbox's id is still held: %+v (%v)", l, err)
	}
}
