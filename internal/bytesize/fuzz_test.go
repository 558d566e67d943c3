package bytesize

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
)

// FuzzParse checks that Parse never panics; that it returns a size in [0, Max] or an *Error naming the input;
// that a size it reads is the same whatever the case of its unit and whether the unit is spelled m, mb, mi or
// mib; and that Format's spelling reads back to the same size.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"0", "512", "64k", "512m", "512M", "512MiB", "512Mi", "2g", "2Gi", "1.5g", "4 MiB", "8p", "1.3k", "-1", "1e9", "4 MiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			var se *Error
			if !errors.As(err, &se) || se.Input != s {
				t.Fatalf("Parse(%q): %v; want an *Error naming the input", s, err)
			}
			return
		}
		if n < 0 || n > Max {
			t.Fatalf("Parse(%q) = %d; outside [0, %d]", s, n, int64(Max))
		}
		if back, err := Parse(Format(n)); err != nil || back != n {
			t.Fatalf("Parse(Format(%d)) = %d, %v", n, back, err)
		}
		// The same number with each spelling of its unit.
		num := strings.TrimRight(s, "kKmMgGtTpPiIbB ")
		unit := strings.ToLower(strings.TrimSpace(s[len(num):]))
		if unit == "" || unit == "b" {
			if f, _ := strconv.ParseFloat(num, 64); f != float64(n) || math.IsNaN(f) {
				t.Fatalf("Parse(%q) = %d; want the number itself", s, n)
			}
			return
		}
		for _, sp := range []string{unit[:1], unit[:1] + "b", unit[:1] + "i", unit[:1] + "ib", strings.ToUpper(unit[:1]) + "iB"} {
			if m, err := Parse(num + sp); err != nil || m != n {
				t.Fatalf("Parse(%q) = %d, %v; Parse(%q) = %d", num+sp, m, err, s, n)
			}
		}
	})
}
