package record

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/sqlite"
)

// TestAttachTenantIsolation: another tenant's run answers exactly like a missing one, so a caller (an API token
// of another tenant) learns neither that it exists nor whose it is.
func TestAttachTenantIsolation(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	run, err := Create(t.Context(), st, store.Run{Tenant: "acme-secret", User: "alice", Trust: store.TrustTrusted,
		ResolvedMode: "inline", Source: "default", Driver: "docker", Admission: store.AdmissionAdmitted})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Attach(t.Context(), st, run.ID, "acme-secret", "alice"); err != nil {
		t.Fatalf("own run: %v", err)
	}
	_, other := Attach(t.Context(), st, run.ID, "globex", "alice")
	_, missing := Attach(t.Context(), st, "01900000-0000-7000-8000-000000000000", "globex", "alice")
	if fault.CodeOf(other) != fault.RunNotFound || fault.CodeOf(missing) != fault.RunNotFound {
		t.Fatalf("other tenant: %v; missing: %v", other, missing)
	}
	if strings.Contains(other.Error(), "acme-secret") || strings.Replace(other.Error(), run.ID, "ID", 1) !=
		strings.Replace(missing.Error(), "01900000-0000-7000-8000-000000000000", "ID", 1) {
		t.Errorf("another tenant's run is told apart from a missing one:\n%v\n%v", other, missing)
	}
	if _, err := Attach(t.Context(), st, run.ID, "acme-secret", "bob"); fault.CodeOf(err) != fault.InvalidArgument {
		t.Errorf("same tenant, other user: %v", err)
	}
}
