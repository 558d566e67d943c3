package ui

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/store"
)

// TestRunPageLog: a run's page shows its log, each entry labelled with its source, as text (markup in a build's
// output is escaped, never rendered); a run without one says so.
func TestRunPageLog(t *testing.T) {
	w := newWorld(t)
	r := w.run("acme", "alice", store.StatusFailed)
	for _, l := range []store.RunLog{
		{Source: store.LogDriver, Text: "docker: create sandbox sandkeep-u-1 from image img"},
		{Source: store.LogBuild, Text: "Step 2/2 : RUN make <script>alert(1)</script>\nmake: *** [all] Error 2\n"},
		{Source: store.LogPostCreate, Text: "post-create-output-line\n"},
	} {
		l.RunID = r.ID
		if _, err := w.st.AppendRunLog(t.Context(), l); err != nil {
			t.Fatal(err)
		}
	}
	empty := w.run("acme", "alice", store.StatusSucceeded)
	secret, _ := w.token("acme", auth.ScopeRead)
	b := w.browser()
	b.signIn(secret)
	a := b.get(Prefix + "runs/" + r.ID)
	if a.status != http.StatusOK {
		t.Fatalf("run page: %d", a.status)
	}
	for _, want := range []string{"data-run-log", "[driver]</span> docker: create sandbox", "[build]</span> Step 2/2 : RUN make &lt;script&gt;alert(1)&lt;/script&gt;",
		"make: *** [all] Error 2", "[post_create]</span> post-create-output-line"} {
		if !strings.Contains(a.body, want) {
			t.Errorf("run page lacks %q", want)
		}
	}
	if strings.Contains(a.body, "<script>alert(1)") {
		t.Error("the build's output was rendered as markup")
	}
	if a := b.get(Prefix + "runs/" + empty.ID); !strings.Contains(a.body, "data-no-log") {
		t.Error("a run without a log does not say so")
	}
}
