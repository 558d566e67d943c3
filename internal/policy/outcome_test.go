package policy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// faultCodes reads internal/fault's Code constants, so that a new code cannot be left out of the table.
func faultCodes(t *testing.T) map[string]fault.Code {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "fault", "fault.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]fault.Code{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for i, name := range vs.Names {
				code, _ := strconv.Unquote(vs.Values[i].(*ast.BasicLit).Value)
				out[name.Name] = fault.Code(code)
			}
		}
	}
	if len(out) < 40 {
		t.Fatalf("found only %d codes in fault.go", len(out))
	}
	return out
}

// TestOutcomeEveryCode: every failure code has a row in the one table.
func TestOutcomeEveryCode(t *testing.T) {
	for name, code := range faultCodes(t) {
		if _, ok := outcomes[code]; !ok {
			t.Errorf("fault.%s (%s) has no row in outcomes", name, code)
		}
	}
}

// TestOutcomeByCode: code by code, how a run that failed with it is recorded, as the run's consumer reads it.
// Setup timeout and capacity may resume; what the input decides is deterministic, so a consumer that
// redelivers infrastructure failures never retries it.
func TestOutcomeByCode(t *testing.T) {
	for _, tc := range []struct {
		code   fault.Code
		status RunStatus
		disp   Disposition
	}{
		{fault.SandboxSetupTimeout, StatusFailedResumable, Infrastructure},
		{fault.SandboxCapacity, StatusFailedResumable, Infrastructure},
		{fault.SpecUnsupported, StatusFailed, Deterministic},
		{fault.BuildFailed, StatusFailed, Deterministic},
		{fault.BuildContextInvalid, StatusFailed, Deterministic},
		{fault.PostCreateFailed, StatusFailed, Deterministic},
		{fault.SecretUnavailable, StatusFailed, Deterministic},
		{fault.SecretsNeedSandbox, StatusFailed, Deterministic},
		{fault.FeatureInvalid, StatusFailed, Deterministic},
		{fault.ComposeInvalid, StatusFailed, Deterministic},
		{fault.NetworkInvalid, StatusFailed, Deterministic},
		{fault.NetworkWidened, StatusFailed, Deterministic},
		{fault.SpecInvalid, StatusFailed, Deterministic},
		{fault.TierRefused, StatusFailed, Deterministic},
		{fault.TemplateNotFound, StatusFailed, Deterministic},
		{fault.ImageUnavailable, StatusFailed, Deterministic},
		{fault.PostureRefused, StatusFailed, Deterministic},
		{fault.InvalidMount, StatusFailed, Deterministic},
		{fault.UntrustedWithoutSandbox, StatusFailed, Deterministic},
		{fault.SandboxDriverUnavailable, StatusFailed, Deterministic},
		{fault.SandboxFailed, StatusFailed, Infrastructure},
		{fault.DriverUnavailable, StatusFailed, Infrastructure},
		{fault.SandboxBusy, StatusFailed, Infrastructure},
		{fault.AgentProtocol, StatusFailed, Infrastructure},
		{fault.SecretDeliveryFailed, StatusFailed, Infrastructure},
		{fault.FeatureUnavailable, StatusFailed, Infrastructure},
		{fault.CompanionFailed, StatusFailed, Infrastructure},
		{fault.StoreUnavailable, StatusFailed, Infrastructure},
	} {
		t.Run(string(tc.code), func(t *testing.T) {
			if o := OutcomeOf(tc.code); o.Status != tc.status || o.Disposition != tc.disp {
				t.Errorf("OutcomeOf(%s) = %s/%s, want %s/%s", tc.code, o.Status, o.Disposition, tc.status, tc.disp)
			}
			// The same through SetupFailure, which record.Finish uses for every run's failure.
			f := SetupFailure(fault.New(tc.code, "", "failed"))
			if fault.CodeOf(f.Err) != tc.code || f.Status != tc.status || f.Disposition != tc.disp {
				t.Errorf("SetupFailure(%s) = %s %s/%s", tc.code, fault.CodeOf(f.Err), f.Status, f.Disposition)
			}
		})
	}
}
