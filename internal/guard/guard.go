// Package guard validates what a caller asks to put into a sandbox: mounts, environment, workdir. Every input
// is untrusted; a refusal is a *fault.Error whose message names the rule and the offending path or name and
// whose hint says what to do instead. The checks are lexical first (cheap, deterministic, testable without a
// host filesystem) and, for mount sources, repeated on the symlink-resolved host path.
package guard

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// badChar reports why s cannot cross into a sandbox as a path or a name, or "" when it can. Invalid UTF-8 is
// refused because the Docker API is JSON, which would silently replace it and bind or run a different path;
// control characters (C0, DEL, C1) are refused because they break logs, terminals and argv parsing.
func badChar(s string) string {
	if !utf8.ValidString(s) {
		return "is not valid UTF-8"
	}
	for _, r := range s {
		if r == 0 {
			return "contains a NUL byte"
		}
		if unicode.IsControl(r) {
			return fmt.Sprintf("contains the control character %U", r)
		}
	}
	return ""
}

// components splits a clean absolute path into its names; "/" has none.
func components(p string) []string {
	if p == "/" {
		return nil
	}
	return strings.Split(strings.TrimPrefix(p, "/"), "/")
}

// prefixMatch reports whether the first len(pre) names of names match pre, where "*" in pre matches any one
// name (for per-user runtime directories such as /run/user/*/podman).
func prefixMatch(names, pre []string) bool {
	if len(pre) > len(names) {
		return false
	}
	for i, p := range pre {
		if p != "*" && p != names[i] {
			return false
		}
	}
	return true
}

// atOrUnder reports whether the clean absolute path p is pattern or lies beneath it.
func atOrUnder(p, pattern string) bool {
	return prefixMatch(components(p), components(pattern))
}

// ancestorOf reports whether the clean absolute path p is a strict ancestor of pattern, so that binding p
// would expose pattern too. A wildcard in pattern matches any name of p: /run/user/1000 is an ancestor of
// /run/user/*/podman.
func ancestorOf(p, pattern string) bool {
	names, pre := components(p), components(pattern)
	if len(names) >= len(pre) {
		return false
	}
	for i, n := range names {
		if pre[i] != "*" && pre[i] != n {
			return false
		}
	}
	return true
}

// quoteName quotes a caller-supplied name for an error message, cut at the first '=' (whatever follows may be
// a secret value pasted into the name) and at 64 bytes (the message stays readable).
func quoteName(name string) string {
	if i := strings.IndexByte(name, '='); i >= 0 {
		name = name[:i] + "=…"
	}
	if len(name) > 64 {
		name = name[:64] + "…"
	}
	return fmt.Sprintf("%q", name)
}
