package build

import (
	"bufio"
	"bytes"
	"fmt"
	"path"
	"strings"
)

// ignore is a parsed .dockerignore: which paths of the context stay out of the build. The syntax it
// understands is in the package comment.
type ignore struct {
	rules         []rule
	hasExceptions bool // some rule is a `!` exception: an excluded directory must still be walked
}

type rule struct {
	elems     []string // the cleaned pattern split on '/'
	exception bool     // a `!` rule: a match re-includes
}

// parseIgnore parses a .dockerignore file's content.
func parseIgnore(data []byte) (*ignore, error) {
	ig := &ignore{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), MaxIgnoreBytes+1)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if n == 1 {
			line = strings.TrimPrefix(line, "\uFEFF")
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		r, err := parseRule(line)
		if err != nil {
			return nil, fmt.Errorf(".dockerignore line %d: %w", n, err)
		}
		ig.rules = append(ig.rules, r)
		ig.hasExceptions = ig.hasExceptions || r.exception
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	return ig, nil
}

func parseRule(line string) (rule, error) {
	var r rule
	p := line
	if strings.HasPrefix(p, "!") {
		r.exception = true
		p = strings.TrimSpace(p[1:])
		if p == "" {
			return r, fmt.Errorf("%q: '!' with no pattern", line)
		}
	}
	p = path.Clean(p)
	if len(p) > 1 && p[0] == '/' {
		p = p[1:]
	}
	switch {
	case p == "." || p == "/":
		return r, fmt.Errorf("%q names the context itself; list what to leave out (e.g. `*`)", line)
	case p == ".." || strings.HasPrefix(p, "../"):
		return r, fmt.Errorf("%q points outside the context", line)
	}
	r.elems = strings.Split(p, "/")
	for _, e := range r.elems {
		if _, err := path.Match(e, ""); err != nil {
			return r, fmt.Errorf("%q: element %q: %w", line, e, err)
		}
	}
	return r, nil
}

// excluded reports whether the context path p (slash-separated, clean, relative to the context root, not ".")
// stays out of the build.
func (ig *ignore) excluded(p string) bool {
	if ig == nil || len(ig.rules) == 0 {
		return false
	}
	elems := strings.Split(p, "/")
	excluded := false
	for _, r := range ig.rules {
		// Only a rule that could change the answer needs evaluating.
		if r.exception != excluded {
			continue
		}
		if matchesOrParent(r.elems, elems) {
			excluded = !r.exception
		}
	}
	return excluded
}

// matchesOrParent reports whether the pattern elements pat match elems or one of its parent directories
// (a non-empty prefix of elems). It is a dynamic programme over (pattern element, path element): linear in
// each, whatever the number of `**`.
func matchesOrParent(pat, elems []string) bool {
	n := len(elems)
	cur := make([]bool, n+1) // cur[j]: the pattern elements so far match elems[:j]
	next := make([]bool, n+1)
	cur[0] = true
	for _, pe := range pat {
		clear(next)
		if pe == "**" {
			seen := false
			for j := 0; j <= n; j++ {
				seen = seen || cur[j]
				next[j] = seen
			}
		} else {
			for j := 1; j <= n; j++ {
				if cur[j-1] {
					next[j], _ = path.Match(pe, elems[j-1]) // validated in parseRule
				}
			}
		}
		cur, next = next, cur
	}
	for j := 1; j <= n; j++ {
		if cur[j] {
			return true
		}
	}
	return false
}
