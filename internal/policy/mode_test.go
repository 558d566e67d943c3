package policy

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
)

var modes = []string{"", "none", "auto", "inline"}

// expectMode restates the rules as plainly as possible, independently of ResolveMode: walk the tiers
// from the highest; the first that states a mode decides, except that --sandbox auto hands the decision to a
// spec that names an image or build and does not say none.
func expectMode(cli, specMode string, specNamesImage bool, env string) (string, Source) {
	if cli == "auto" && specNamesImage && specMode != "none" {
		if specMode == "" {
			return "auto", SourceSpec
		}
		return specMode, SourceSpec
	}
	if cli != "" {
		return cli, SourceCLI
	}
	rank := map[string]int{"none": 0, "auto": 1, "inline": 2}
	if specMode != "" && env != "" && rank[env] > rank[specMode] {
		return env, SourceEnv // the repository may raise isolation, never lower the operator's default
	}
	if specMode != "" {
		return specMode, SourceSpec
	}
	if env != "" {
		return env, SourceEnv
	}
	return "auto", SourceDefault
}

// TestResolveMode covers every row: cli x spec x image-or-build x env, each mode, against expectMode, plus the
// rows the issue states in words, plus invalid values in every tier.
func TestResolveMode(t *testing.T) {
	type row struct {
		name             string
		in               ModeInputs
		wantMode         string
		wantSource       Source
		wantInvalid      Source // the tier whose value is rejected; "" when valid
		wantInvalidValue string
	}
	var rows []row
	for _, cli := range modes {
		for _, sm := range modes {
			for _, img := range []bool{false, true} {
				for _, env := range modes {
					m, s := expectMode(cli, sm, img, env)
					rows = append(rows, row{
						name:     fmt.Sprintf("cli=%q/spec=%q/image=%v/env=%q", cli, sm, img, env),
						in:       ModeInputs{CLI: cli, Spec: sm, SpecNamesImage: img, Env: env},
						wantMode: m, wantSource: s,
					})
				}
			}
		}
	}
	if len(rows) != 4*4*2*4 {
		t.Fatalf("generated %d rows, want 128", len(rows))
	}
	// The rules in the words, written out by hand so that expectMode cannot be wrong alone.
	rows = append(rows,
		row{name: "nothing set: built-in default", in: ModeInputs{}, wantMode: "auto", wantSource: SourceDefault},
		row{name: "env decides when cli and spec inherit", in: ModeInputs{Env: "inline"}, wantMode: "inline", wantSource: SourceEnv},
		row{name: "a stricter spec beats env", in: ModeInputs{Spec: "inline", Env: "auto"}, wantMode: "inline", wantSource: SourceSpec},
		row{name: "a weaker spec does not lower env", in: ModeInputs{Spec: "none", Env: "inline"}, wantMode: "inline", wantSource: SourceEnv},
		row{name: "spec auto does not lower env inline", in: ModeInputs{Spec: "auto", Env: "inline"}, wantMode: "inline", wantSource: SourceEnv},
		row{name: "cli beats spec", in: ModeInputs{CLI: "inline", Spec: "none"}, wantMode: "inline", wantSource: SourceCLI},
		row{name: "cli none wins over a spec with image and inline",
			in: ModeInputs{CLI: "none", Spec: "inline", SpecNamesImage: true, Env: "inline"}, wantMode: "none", wantSource: SourceCLI},
		row{name: "cli auto yields to spec inline with image",
			in: ModeInputs{CLI: "auto", Spec: "inline", SpecNamesImage: true}, wantMode: "inline", wantSource: SourceSpec},
		row{name: "cli auto yields to a spec that names an image and inherits",
			in: ModeInputs{CLI: "auto", SpecNamesImage: true, Env: "none"}, wantMode: "auto", wantSource: SourceSpec},
		row{name: "cli auto does not yield to a spec without image or build",
			in: ModeInputs{CLI: "auto", Spec: "inline"}, wantMode: "auto", wantSource: SourceCLI},
		row{name: "cli auto does not yield to a spec saying none",
			in: ModeInputs{CLI: "auto", Spec: "none", SpecNamesImage: true}, wantMode: "auto", wantSource: SourceCLI},
		row{name: "cli inline does not yield", in: ModeInputs{CLI: "inline", Spec: "auto", SpecNamesImage: true},
			wantMode: "inline", wantSource: SourceCLI},
		row{name: "an image alone does not make the spec decide", in: ModeInputs{SpecNamesImage: true, Env: "none"},
			wantMode: "none", wantSource: SourceEnv},
	)
	// Invalid values, in every tier, including tiers a higher one overrides (fail closed).
	for _, bad := range []string{"None", " auto", "auto ", "off", "inherit", "yes", "inline\n", "\x00"} {
		rows = append(rows,
			row{name: "invalid cli " + fmt.Sprintf("%q", bad), in: ModeInputs{CLI: bad}, wantInvalid: SourceCLI, wantInvalidValue: bad},
			row{name: "invalid spec " + fmt.Sprintf("%q", bad), in: ModeInputs{CLI: "none", Spec: bad}, wantInvalid: SourceSpec, wantInvalidValue: bad},
			row{name: "invalid env " + fmt.Sprintf("%q", bad), in: ModeInputs{CLI: "inline", Spec: "auto", Env: bad}, wantInvalid: SourceEnv, wantInvalidValue: bad},
		)
	}
	rows = append(rows, row{name: "first bad tier is reported", in: ModeInputs{CLI: "x", Spec: "y", Env: "z"},
		wantInvalid: SourceCLI, wantInvalidValue: "x"})

	for _, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveMode(tc.in)
			if tc.wantInvalid != "" {
				var ime *InvalidModeError
				if !errors.As(err, &ime) || ime.Source != tc.wantInvalid || ime.Value != tc.wantInvalidValue {
					t.Fatalf("ResolveMode(%+v) = %+v, %v; want an *InvalidModeError for %s %q", tc.in, got, err, tc.wantInvalid, tc.wantInvalidValue)
				}
				if c := fault.CodeOf(err); c != fault.InvalidArgument {
					t.Errorf("code %q, want %s", c, fault.InvalidArgument)
				}
				return
			}
			if err != nil {
				t.Fatalf("ResolveMode(%+v): %v", tc.in, err)
			}
			if got.Mode != tc.wantMode || got.Source != tc.wantSource {
				t.Errorf("ResolveMode(%+v) = %s from %s; want %s from %s", tc.in, got.Mode, got.Source, tc.wantMode, tc.wantSource)
			}
			if got.Note == "" {
				t.Error("empty Note")
			}
		})
	}
}
