//go:build linux

package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseNetInitFlags(t *testing.T) {
	ok := []string{"--net-channel", "10.0.0.1:7070", "--pod", "sandkeep-u-abc", "--token-file", "/.sandkeep-token/token"}
	f, err := parseInitFlags(ok)
	if err != nil || f.netChannel != "10.0.0.1:7070" || f.pod != "sandkeep-u-abc" || f.tokenFile != "/.sandkeep-token/token" {
		t.Fatalf("parseInitFlags(%q) = %+v, %v", ok, f, err)
	}
	if _, _, err := parseInitArgs(ok); err == nil {
		t.Errorf("parseInitArgs took --net-channel as the Unix channel")
	}
	withEgress := append(ok[:len(ok):len(ok)], "--egress", "127.0.0.1:3128")
	if f, err := parseInitFlags(withEgress); err != nil || f.egress != "127.0.0.1:3128" || f.netChannel == "" {
		t.Fatalf("parseInitFlags(%q) = %+v, %v", withEgress, f, err)
	}
	for name, args := range map[string][]string{
		"host name":     {"--net-channel", "sandkeep.svc:7070", "--pod", "p", "--token-file", "/t"},
		"no port":       {"--net-channel", "10.0.0.1", "--pod", "p", "--token-file", "/t"},
		"port 0":        {"--net-channel", "10.0.0.1:0", "--pod", "p", "--token-file", "/t"},
		"no pod":        {"--net-channel", "10.0.0.1:7070", "--token-file", "/t"},
		"no token file": {"--net-channel", "10.0.0.1:7070", "--pod", "p"},
		"relative file": {"--net-channel", "10.0.0.1:7070", "--pod", "p", "--token-file", "t"},
		"both channels": {"--channel", "/c/a.sock", "--net-channel", "10.0.0.1:7070", "--pod", "p", "--token-file", "/t"},
		"pod alone":     {"--pod", "p"},
		"relay and net": {"--net-channel", "10.0.0.1:7070", "--pod", "p", "--token-file", "/t", "--relay"},
		"long pod":      {"--net-channel", "10.0.0.1:7070", "--pod", strings.Repeat("p", 254), "--token-file", "/t"},
		"egress not lo": {"--net-channel", "10.0.0.1:7070", "--pod", "p", "--token-file", "/t", "--egress", "10.0.0.1:3128"},
	} {
		if f, err := parseInitFlags(args); err == nil {
			t.Errorf("%s: parseInitFlags(%q) = %+v; want an error", name, args, f)
		}
	}
}

// TestParseProbeNet: seconds in 0..300 (0: once) and IP:port addresses only (the probe pod needs no DNS, and the driver
// names the addresses it listens on).
func TestParseProbeNet(t *testing.T) {
	if secs, addrs, err := parseProbeNet([]string{"20", "10.0.0.1:7071", "[fd00::1]:7072"}); err != nil || secs != 20 || len(addrs) != 2 {
		t.Fatalf("parseProbeNet = %d %q %v", secs, addrs, err)
	}
	for name, args := range map[string][]string{
		"nothing":   nil,
		"no addr":   {"20"},
		"negative":  {"-1", "10.0.0.1:1"},
		"too long":  {"301", "10.0.0.1:1"},
		"host name": {"5", "sandkeep.svc:7071"},
		"no port":   {"5", "10.0.0.1"},
	} {
		if _, _, err := parseProbeNet(args); err == nil {
			t.Errorf("%s: parseProbeNet(%q) took it", name, args)
		}
	}
}

// TestToken: install writes the token mode 0400 from the init container's variable; init reads it once and the
// file is gone; a link in its place is not followed (and is removed); a short token is refused.
func TestToken(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	token := strings.Repeat("ab", 32)
	t.Setenv(tokenEnv, token)
	if err := writeToken(path); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o400 {
		t.Fatalf("token file: %v, %v; want mode 0400", fi, err)
	}
	got, err := takeToken(path)
	if err != nil || string(got) != token {
		t.Fatalf("takeToken = %q, %v", got, err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the token file is still there after init read it: %v", err)
	}
	if _, err := takeToken(path); err == nil {
		t.Errorf("takeToken read a token twice")
	}

	secret := filepath.Join(dir, "elsewhere")
	if err := os.WriteFile(secret, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, path); err != nil {
		t.Fatal(err)
	}
	if _, err := takeToken(path); err == nil {
		t.Errorf("takeToken followed a symlink")
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the symlink is still there: %v", err)
	}

	t.Setenv(tokenEnv, "short")
	if err := writeToken(filepath.Join(dir, "t2")); err == nil {
		t.Errorf("writeToken wrote a short token")
	}
}
