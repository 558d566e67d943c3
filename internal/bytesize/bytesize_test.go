package bytesize

import (
	"errors"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
	}{
		{"0", 0}, {"512", 512}, {"512b", 512}, {"512B", 512},
		{"64k", 64 << 10}, {"64K", 64 << 10}, {"64kb", 64 << 10}, {"64KiB", 64 << 10}, {"64Ki", 64 << 10},
		// The list: every spelling of 512 MiB and 2 GiB.
		{"512m", 512 << 20}, {"512M", 512 << 20}, {"512MB", 512 << 20}, {"512MiB", 512 << 20}, {"512Mi", 512 << 20},
		{"2g", 2 << 30}, {"2G", 2 << 30}, {"2GiB", 2 << 30}, {"2Gi", 2 << 30}, {"2gb", 2 << 30},
		{"1t", 1 << 40}, {"1Ti", 1 << 40}, {"1p", 1 << 50}, {"8p", Max},
		{"1.5g", 3 << 29}, {"0.5k", 512}, {"1.5k", 1536},
		{"9007199254740992", Max}, {"999999999999999", 999999999999999},
	} {
		got, err := Parse(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("Parse(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for _, in := range []string{
		"", " ", "g", "Mi", "-1", "+1", "1.5", "1.3k", "1e9", "0x10", "1..5g", ".5g", "5.g",
		"512mm", "512iB", "512bi", "512MIb ", " 512m", "4 MiB", "2 g", "512Mb2", "1q", "1E", "1Ei",
		"9007199254740993", "9p", "8193t", "99999999999999999999g", "NaN", "Inf", "1_000",
	} {
		got, err := Parse(in)
		var se *Error
		if err == nil || !errors.As(err, &se) || se.Input != in {
			t.Errorf("Parse(%q) = %d, %v; want an *Error naming the input", in, got, err)
		}
	}
}

// TestOneWording: every refusal reads the same but for the input, whatever was wrong with it.
func TestOneWording(t *testing.T) {
	want := (&Error{Input: "X"}).Error()
	for _, in := range []string{"1q", "9p", "1.3k", "-1"} {
		_, err := Parse(in)
		if got := err.Error(); got != (&Error{Input: in}).Error() || len(got)-len(in) != len(want)-1 {
			t.Errorf("Parse(%q): %q; want the one wording %q", in, got, want)
		}
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{0: "0B", 1000: "1000B", 1 << 10: "1KiB", 64 << 20: "64MiB", 3 << 29: "1536MiB", 2 << 30: "2GiB", Max: "8PiB"} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q; want %q", n, got, want)
		}
		if back, err := Parse(want); err != nil || back != n {
			t.Errorf("Parse(Format(%d)) = %d, %v", n, back, err)
		}
	}
}
