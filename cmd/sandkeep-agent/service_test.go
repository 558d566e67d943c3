//go:build linux

package main

import (
	"slices"
	"testing"
)

// TestServiceFlags: init's --service takes loopback addresses only, repeated, and only beside --channel (the
// host service's socket is next to the channel's).
func TestServiceFlags(t *testing.T) {
	ch := []string{"--channel", "/c/a.sock"}
	f, err := parseInitFlags(append(ch, "--service", "127.0.0.1:3130", "--service=127.0.0.1:3131"))
	if err != nil || !slices.Equal(f.services, []string{"127.0.0.1:3130", "127.0.0.1:3131"}) {
		t.Fatalf("two services: %+v, %v", f, err)
	}
	for name, args := range map[string][]string{
		"without channel": {"--service", "127.0.0.1:3130"},
		"not loopback":    append(ch, "--service", "0.0.0.0:3130"),
		"port 0":          append(ch, "--service", "127.0.0.1:0"),
		"no port":         append(ch, "--service", "127.0.0.1"),
		"a name":          append(ch, "--service", "localhost:3130"),
	} {
		if f, err := parseInitFlags(args); err == nil {
			t.Errorf("%s: parseInitFlags(%q) = %+v; want an error", name, args, f)
		}
	}
	many := slices.Clone(ch)
	for i := range maxServices + 1 {
		many = append(many, "--service", "127.0.0.1:"+string(rune('0'+i%10))+"313")
	}
	if _, err := parseInitFlags(many); err == nil {
		t.Errorf("%d services accepted", maxServices+1)
	}
}
