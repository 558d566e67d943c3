// Package homedir names the default state home, and cleans and resolves paths the way path/filepath does on
// Unix. It imports no package that is initialised late in a big binary (path/filepath, net, regexp: see
// cmd/sandkeep/internal/fastpath, whose init must run early), so that the CLI's start-up fast path resolves the
// same home as package sandkeep without waiting for the heavy packages' inits.
package homedir

import (
	"os"
	"strconv"
	"strings"
)

// Default is the state home when neither --home nor SANDKEEP_HOME names one: /var/lib/sandkeep for root, else
// $XDG_STATE_HOME/sandkeep, else ~/.local/state/sandkeep, else a per-uid directory under the temporary directory.
func Default() string {
	if os.Geteuid() == 0 {
		return "/var/lib/sandkeep"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return Join(d, "sandkeep")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return Join(h, ".local", "state", "sandkeep")
	}
	return Join(os.TempDir(), "sandkeep-"+strconv.Itoa(os.Geteuid()))
}

// Join is filepath.Join on Unix: the non-empty elements joined by "/", cleaned; "" when all are empty.
func Join(elem ...string) string {
	var parts []string
	for _, e := range elem {
		if e != "" {
			parts = append(parts, e)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return Clean(strings.Join(parts, "/"))
}

// Clean is filepath.Clean on Unix: the shortest path naming the same file by lexical processing alone.
func Clean(p string) string {
	rooted := strings.HasPrefix(p, "/")
	var out []string
	for _, e := range strings.Split(p, "/") {
		switch {
		case e == "" || e == ".":
		case e == ".." && len(out) > 0 && out[len(out)-1] != "..":
			out = out[:len(out)-1]
		case e == ".." && rooted:
		default:
			out = append(out, e)
		}
	}
	s := strings.Join(out, "/")
	switch {
	case rooted:
		return "/" + s
	case s == "":
		return "."
	}
	return s
}

// IsAbs is filepath.IsAbs on Unix.
func IsAbs(p string) bool { return strings.HasPrefix(p, "/") }

// Abs is filepath.Abs on Unix: p made absolute against the working directory, cleaned.
func Abs(p string) (string, error) {
	if IsAbs(p) {
		return Clean(p), nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return Join(wd, p), nil
}
