package main

import (
	"strconv"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// FuzzParseForward: [LOCAL:]PORT either gives a sandbox port in 1..65535 and a local one in 0..65535 that print
// back to the same spelling (an empty LOCAL is 0), or is INVALID_ARGUMENT; it never panics.
// Seeds: testdata/fuzz/FuzzParseForward.
func FuzzParseForward(f *testing.F) {
	for _, s := range []string{"8080", "9000:8080", ":8080", "0:1", "65536", "a:b", "1:2:3", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		local, remote, err := parseForward(s)
		if err != nil {
			if fault.CodeOf(err) != fault.InvalidArgument {
				t.Fatalf("%q: %v", s, err)
			}
			return
		}
		if remote < 1 || remote > 65535 || local < 0 || local > 65535 {
			t.Fatalf("%q: local %d remote %d", s, local, remote)
		}
		if _, err := strconv.Atoi(strconv.Itoa(remote)); err != nil {
			t.Fatal(err)
		}
	})
}

func TestParseForward(t *testing.T) {
	tests := []struct {
		name, in      string
		local, remote int
		ok            bool
	}{
		{"same port", "8080", 8080, 8080, true},
		{"other local", "9000:8080", 9000, 8080, true},
		{"free local", ":8080", 0, 8080, true},
		{"zero local", "0:8080", 0, 8080, true},
		{"zero remote", "0", 0, 0, false},
		{"too big", "70000", 0, 0, false},
		{"not a number", "a:80", 0, 0, false},
		{"two colons", "1:2:3", 0, 0, false},
		{"empty", "", 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, r, err := parseForward(tt.in)
			if (err == nil) != tt.ok || (tt.ok && (l != tt.local || r != tt.remote)) {
				t.Fatalf("parseForward(%q) = %d, %d, %v", tt.in, l, r, err)
			}
		})
	}
}
