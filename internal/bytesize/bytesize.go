// Package bytesize reads the sizes an operator or a repository writes (sandkeep.yaml's resources and tmpfs
// sizes, templates, the server config, --output-limit, devcontainer.json's hostRequirements, the kubernetes
// driver's workspace size) in one way, with one error wording, through docker/go-units.
//
// Every unit is a power of 1024, as `docker run --memory` reads it: 512m, 512M, 512MB, 512MiB and the Kubernetes
// spelling 512Mi are all 512 MiB; no unit (or b) is bytes. Kubernetes' decimal quantities are not read: there
// "512M" is 512,000,000 and "512m" a thousandth of 512, and a size that means one thing in one file and another
// in the next is how a sandbox gets a thousand times less memory than its operator meant.
package bytesize

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	units "github.com/docker/go-units"
)

// Max is the largest size read: 8 PiB. Up to 2^53, go-units' float64 arithmetic is exact, so a size written
// in bytes comes back as written.
const Max = 1 << 53

// shape is what Parse reads: a number (a fraction only with a unit) and, right after it, an optional unit k,
// m, g, t or p with an optional i and b (Mi, MiB, MB, m), or b alone.
var shape = regexp.MustCompile(`^([0-9]{1,20})(\.[0-9]{1,20})?(([kKmMgGtTpP])([iI]?)([bB]?)|[bB])?$`)

// Error is a size that cannot be read. Its message is the same wherever a size is read; callers say which
// field or flag it came from.
type Error struct {
	Input string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%q is not a size: write a whole number of bytes, or a number with a unit k, m, g, t or p "+
		"(powers of 1024: 512m, 512MiB and 512Mi are the same), at most 8PiB", e.Input)
}

// Parse reads s as a size in bytes: "65536", "64k", "512m", "512M", "512MB", "512MiB", "512Mi", "1.5g", "2Gi".
// A fraction must come to whole bytes ("1.5k" is 1536; "1.3k" is refused, and so is "1.5" of bytes).
func Parse(s string) (int64, error) {
	m := shape.FindStringSubmatch(s)
	if m == nil {
		return 0, &Error{Input: s}
	}
	shift := 0
	if unit := strings.ToLower(m[4]); unit != "" {
		shift = 10 * (1 + strings.Index("kmgtp", unit))
	}
	// The range, on the whole part exactly; then the whole-byte check on the same float64 go-units computes
	// with, so the two cannot differ.
	whole, err := strconv.ParseUint(m[1], 10, 64)
	if err != nil || whole > Max>>shift {
		return 0, &Error{Input: s}
	}
	f, err := strconv.ParseFloat(m[1]+m[2], 64)
	if f *= float64(int64(1) << shift); err != nil || f > Max || f != math.Trunc(f) {
		return 0, &Error{Input: s}
	}
	in := s
	if m[5] != "" && m[6] == "" { // Kubernetes' Mi: go-units reads MiB
		in += "B"
	}
	n, err := units.RAMInBytes(in)
	if err != nil || n != int64(f) {
		return 0, &Error{Input: s}
	}
	return n, nil
}

// Format writes n the way Parse reads it back: in the largest binary unit that divides it (64MiB, 1GiB), else
// in bytes (1000B).
func Format(n int64) string {
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"PiB", 1 << 50}, {"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}
