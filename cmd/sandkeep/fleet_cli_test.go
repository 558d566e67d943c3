package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	sdk "github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestCLIBesideServeNetwork: while `sandkeep serve --spec` holds a user's sandbox and its egress proxy, a
// networked command of the same user from the CLI, with its own operator input (so it runs in-process, not on
// serve's socket), reaches its allowed loopback host through serve's proxy under the CLI's own policy: the host
// its spec does not name is refused. With SANDKEEP_DAEMON=on the same call is DAEMON_MISMATCH (the operator's
// input differs), never EGRESS_UNAVAILABLE.
func TestCLIBesideServeNetwork(t *testing.T) {
	if gvisor() {
		t.Skip("under gVisor no sandbox has a network (TestExecRuntime)")
	}
	c := newCLI(t)
	var hosts [2]string
	for i, body := range []string{"allowed-4c1", "other-4c2"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) }))
		t.Cleanup(srv.Close)
		hosts[i] = strings.TrimPrefix(srv.URL, "http://")
	}
	spec := filepath.Join(t.TempDir(), "sandkeep.yaml")
	if err := os.WriteFile(spec, []byte("sandbox:\n  mode: inline\n  image: "+testutil.ProbeImage(t)+
		"\n  network: {mode: allowlist, rules: [\""+hosts[0]+"\"]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The operator lets repositories name addresses (the test hosts are on loopback), for serve and the CLI alike.
	operator := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	if err := os.WriteFile(operator, []byte("repo_network_ip_rules: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.env = append(c.env, "SANDKEEP_CONFIG="+operator)
	s := c.startServer(t, "--spec", spec)
	tenant := c.ten("beside")
	cl := s.client(t, c.createToken(t, tenant, "beside", "").Token)
	get := func(host string) string { return testutil.ProbePath + " proxied http://" + host + "/" }
	// serve takes the user's sandbox and its proxy with a networked command of its own.
	res, err := cl.Exec(bounded(t), "u", sdk.ExecRequest{Command: get(hosts[0])})
	if err != nil || !strings.Contains(res.Stdout, "allowed-4c1") {
		t.Fatalf("the server's own networked command: %+v %v", res, err)
	}

	r := c.runWith(t, nil, []string{"SANDKEEP_DAEMON=auto"}, "exec", "--spec", spec, "--tenant", tenant, "--user", "u", "--",
		"sh", "-c", get(hosts[0])+"; "+get(hosts[1])+"; true")
	if r.code != 0 || !strings.Contains(r.stdout, "status 200") || !strings.Contains(r.stdout, "allowed-4c1") ||
		strings.Contains(r.stdout, "other-4c2") || !strings.Contains(r.stdout, "denied=") {
		t.Fatalf("the CLI's networked command beside serve: exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
	if strings.Contains(r.stderr, "EGRESS_UNAVAILABLE") {
		t.Fatalf("the CLI beside serve: %s", r.stderr)
	}
	// The server's proxy is still its own: its next networked command works as before.
	if res, err := cl.Exec(bounded(t), "u", sdk.ExecRequest{Command: get(hosts[0])}); err != nil || !strings.Contains(res.Stdout, "allowed-4c1") {
		t.Fatalf("the server's command after the CLI's: %+v %v", res, err)
	}

	c.runWith(t, nil, []string{"SANDKEEP_DAEMON=on"}, "exec", "--spec", spec, "--tenant", tenant, "--user", "u", "--",
		"sh", "-c", get(hosts[0])).wantFailure(t, "DAEMON_MISMATCH")
}
