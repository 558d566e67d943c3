package guard

import (
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// secret is a value that must never appear in an error.
const secret = "hunter2-s3cr3t-value"

func TestEnvVar(t *testing.T) {
	tests := []struct {
		name  string
		key   string
		value string
		err   string // "" accepts
	}{
		{"plain", "API_URL", "https://example.com", ""},
		{"empty value", "EMPTY", "", ""},
		{"multiline value", "PEM", "-----BEGIN-----\nabc\n-----END-----\n", ""},
		{"value with equals", "OPTS", "a=b=c", ""},
		{"value control chars", "RAW", "\x01\x1b[31m", ""},
		{"lower and digits", "path2", secret, ""},
		{"unicode name", "ÉTAT", secret, ""},
		{"max name", strings.Repeat("N", MaxEnvNameLen), secret, ""},
		{"max value", "BIG", strings.Repeat("v", MaxEnvValueLen), ""},
		{"empty name", "", secret, "name is empty"},
		{"long name", strings.Repeat("N", MaxEnvNameLen+1), secret, "over the limit of 1024"},
		{"equals in name", "TOKEN=" + secret, secret, `"TOKEN=…" contains '='`},
		{"nul in name", "A\x00B", secret, `"A\x00B" contains a NUL`},
		{"cr in name", "A\rB", secret, "control character"},
		{"lf in name", "A\nB", secret, "control character"},
		{"tab in name", "A\tB", secret, "control character"},
		{"del in name", "A\x7f", secret, "control character"},
		{"c1 in name", "A\u0085", secret, "control character"},
		{"invalid utf8 name", "A\xff", secret, "UTF-8"},
		{"nul in value", "KEY", secret + "\x00", `"KEY" has a NUL byte`},
		{"long value", "KEY", secret + strings.Repeat("v", MaxEnvValueLen), `"KEY" has a value of`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := EnvVar(tt.key, tt.value)
			if tt.err == "" {
				if err != nil {
					t.Fatalf("EnvVar(%q) = %v, want nil", tt.key, err)
				}
				return
			}
			wantFault(t, err, fault.InvalidEnv, tt.err)
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error leaks the value: %v", err)
			}
		})
	}
}

func TestEnv(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		err  string
	}{
		{"nil", nil, ""},
		{"several", []string{"A=1", "B=", "C=x=y", "A=2"}, ""},
		{"no equals", []string{"A=1", secret}, "entry 1 has no '='"},
		{"empty name", []string{"=" + secret}, "name is empty"},
		{"bad name", []string{"A\nB=" + secret}, `"A\nB"`},
		{"bad value", []string{"KEY=" + secret + "\x00"}, `"KEY" has a NUL`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Env(tt.env)
			if tt.err == "" {
				if err != nil {
					t.Fatalf("Env(%q) = %v, want nil", tt.env, err)
				}
				return
			}
			wantFault(t, err, fault.InvalidEnv, tt.err)
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error leaks the value: %v", err)
			}
		})
	}
}
