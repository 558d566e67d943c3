package sandkeep_test

import (
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/store"
)

// TestLiteralKeyAdmission: a Key written as a literal (the public alias allows it) is checked at admission as
// NewKey checks its parts, so an empty or control-character user is INVALID_IDENTITY with no run recorded; and a
// valid literal key is the same key as NewKey's: its command lands in the sandbox the other finds.
func TestLiteralKeyAdmission(t *testing.T) {
	t.Parallel()
	cfg := fakeConfig(t)
	m, err := sandkeep.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, k := range []sandkeep.Key{{Tenant: "acme"}, {User: "alice"}, {Tenant: "acme", User: "al\x01ice"}} {
		run, err := m.Admit(t.Context(), sandkeep.RunRequest{Key: k})
		if sandkeep.CodeOf(err) != "INVALID_IDENTITY" || run != nil {
			t.Fatalf("Admit(%q) = %v, %v; want INVALID_IDENTITY and no run", k, run, err)
		}
	}
	if runs, err := cfg.Store.ListRuns(t.Context(), store.RunFilter{}); err != nil || len(runs) != 0 {
		t.Fatalf("runs after refused keys: %v, %v", runs, err)
	}

	literal := sandkeep.Key{Tenant: "acme", User: "alice"}
	if _, err := m.Exec(t.Context(), literal, sandkeep.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	made, err := sandkeep.NewKey("acme", "alice")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := m.Sandbox(t.Context(), made)
	if err != nil || sb.ID == "" {
		t.Fatalf("Sandbox(NewKey) after a literal key's command = %+v, %v", sb, err)
	}
}
