package doctor

import (
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestParsePreflight: every spelling of yes turns the preflight on, in any case; the spellings of no leave it off;
// anything else is refused rather than read as off.
func TestParsePreflight(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Preflight
		bad  bool
	}{
		{in: "1", want: Preflight{On: true}}, {in: "true", want: Preflight{On: true}}, {in: "TRUE", want: Preflight{On: true}},
		{in: "yes", want: Preflight{On: true}}, {in: "Yes", want: Preflight{On: true}}, {in: "on", want: Preflight{On: true}},
		{in: "ON", want: Preflight{On: true}}, {in: " true ", want: Preflight{On: true}},
		{in: "strict", want: Preflight{On: true, Strict: true}}, {in: "Strict", want: Preflight{On: true, Strict: true}},
		{in: ""}, {in: "0"}, {in: "false"}, {in: "no"}, {in: "off"}, {in: "OFF"},
		{in: "enabled", bad: true}, {in: "2", bad: true}, {in: "y", bad: true},
	} {
		got, err := ParsePreflight(tc.in)
		if tc.bad != (err != nil) || got != tc.want {
			t.Errorf("ParsePreflight(%q) = %+v, %v", tc.in, got, err)
		}
		if err != nil && fault.CodeOf(err) != fault.InvalidArgument {
			t.Errorf("ParsePreflight(%q): %v, want INVALID_ARGUMENT", tc.in, err)
		}
	}
}

// TestPreflightVerdict: a failure refuses; a warning is kept to be printed; a check that could not run is a
// warning, and a failure when strict.
func TestPreflightVerdict(t *testing.T) {
	res := []Result{{Name: "a", Status: Pass}, {Name: "b", Status: Warn}, {Name: "c", Status: Skip}, {Name: "d", Status: Fail}}
	failed, warnings := Preflight{On: true}.Verdict(res)
	if len(failed) != 1 || failed[0].Name != "d" || len(warnings) != 2 || warnings[0].Name != "b" || warnings[1].Name != "c" {
		t.Errorf("not strict: failed %v, warnings %v", failed, warnings)
	}
	failed, warnings = Preflight{On: true, Strict: true}.Verdict(res)
	if len(failed) != 2 || failed[0].Name != "c" || len(warnings) != 1 {
		t.Errorf("strict: failed %v, warnings %v", failed, warnings)
	}
}

func FuzzParsePreflight(f *testing.F) {
	for _, s := range []string{"1", "TRUE", "yes", "on", "strict", "", "off", "bogus"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePreflight(s)
		if err != nil && p != (Preflight{}) {
			t.Fatalf("an error with a verdict: %+v", p)
		}
		if p.Strict && !p.On {
			t.Fatalf("strict but off: %q", s)
		}
	})
}
