package build

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
)

// The engine's builder fetches `ADD <url>` itself, from the host's network (metadata endpoints, the intranet),
// whatever network mode the RUN steps get, and `RUN --network=...` asks for a network for one step. Both are
// refused in a repository's Dockerfile before anything is sent: a build never reaches a network.
const hintNetworkStep = "fetch it in post_create (which runs under the sandbox's network policy), or vendor the file into the repository and COPY it"

// CheckDockerfile parses a Dockerfile with BuildKit's parser (the one `docker build` uses) and refuses every
// instruction that would reach a network during the build, ONBUILD triggers included: an ADD whose source is a
// URL (any scheme, or git@host:...) or is not literal (a $variable could expand to a URL), and a RUN with a
// --network flag other than none. name is the Dockerfile's path for the message. A Dockerfile the parser
// rejects is refused too.
func CheckDockerfile(name string, data []byte) error {
	res, err := parser.Parse(bytes.NewReader(data))
	if err != nil {
		return invalidWrap(err, "fix the Dockerfile's syntax", "the Dockerfile %s does not parse: %v", name, err)
	}
	for _, n := range res.AST.Children {
		if err := checkInstruction(name, n, false); err != nil {
			return err
		}
	}
	return nil
}

func checkInstruction(name string, n *parser.Node, onbuild bool) error {
	where := fmt.Sprintf("%s:%d", name, n.StartLine)
	if onbuild {
		where += " (ONBUILD)"
	}
	switch strings.ToLower(n.Value) {
	case "onbuild":
		if n.Next != nil {
			for _, c := range n.Next.Children {
				if err := checkInstruction(name, c, true); err != nil {
					return err
				}
			}
		}
	case "add":
		var args []string
		for a := n.Next; a != nil; a = a.Next {
			args = append(args, a.Value)
		}
		if len(args) < 2 {
			return nil // the builder reports it
		}
		for _, src := range args[:len(args)-1] {
			switch {
			case isRemote(src):
				return invalid(hintNetworkStep,
					"%s: ADD %s would be fetched by the engine from the host's network; builds get no network", where, src)
			case strings.ContainsAny(src, "$"):
				return invalid("write ADD's source literally (use COPY for files of the repository)",
					"%s: ADD source %q is not literal: a variable could make it a URL the engine fetches from the host's network", where, src)
			}
		}
	case "run":
		for _, f := range n.Flags {
			k, v, _ := strings.Cut(strings.TrimLeft(f, "-"), "=")
			if strings.EqualFold(k, "network") && v != "none" {
				return invalid(hintNetworkStep, "%s: RUN %s asks for a network; builds get none", where, f)
			}
		}
	}
	return nil
}

// isRemote reports whether an ADD source names something off the machine: a URL of any scheme, or a git remote.
func isRemote(src string) bool {
	if i := strings.Index(src, "://"); i > 0 && !strings.ContainsAny(src[:i], "/.") {
		return true
	}
	return strings.HasPrefix(src, "git@")
}

// Bases returns the images a Dockerfile asks the engine for, in order and each once: every FROM that names
// neither an earlier stage nor scratch, and every COPY --from that names neither a stage (by name or index).
// An image the engine lacks is pulled by it during the build from whatever registry the name says, so the
// caller checks these before sending anything (issue 22, finding 6). FROM's image is expanded with the
// Dockerfile's global ARGs (those before the first FROM), args overriding their defaults, as the builder
// does; a name that expands to nothing, and a COPY --from that is not literal, are refused with
// CodeContextInvalid, since the builder could resolve them to an image this check never saw.
func Bases(name string, data []byte, args map[string]string) ([]string, error) {
	res, err := parser.Parse(bytes.NewReader(data))
	if err != nil {
		return nil, invalidWrap(err, "fix the Dockerfile's syntax", "the Dockerfile %s does not parse: %v", name, err)
	}
	lex := shell.NewLex(res.EscapeToken)
	var meta []string // the global ARGs as NAME=value, in order
	stages := map[string]bool{}
	nStages := 0
	var out []string
	seen := map[string]bool{}
	add := func(ref string) {
		if !seen[ref] {
			seen[ref] = true
			out = append(out, ref)
		}
	}
	for _, n := range res.AST.Children {
		where := fmt.Sprintf("%s:%d", name, n.StartLine)
		switch strings.ToLower(n.Value) {
		case "arg":
			if nStages > 0 {
				continue // a stage's ARG does not reach FROM
			}
			for a := n.Next; a != nil; a = a.Next {
				k, v, hasDefault := strings.Cut(a.Value, "=")
				if over, ok := args[k]; ok {
					v, hasDefault = over, true
				}
				if hasDefault {
					v, _, _ = lex.ProcessWord(v, shell.EnvsFromSlice(meta))
					meta = append(meta, k+"="+v)
				}
			}
		case "from":
			if n.Next == nil {
				return nil, invalid("name the base image: FROM image[:tag]", "%s: FROM names no image", where)
			}
			image, _, err := lex.ProcessWord(n.Next.Value, shell.EnvsFromSlice(meta))
			if err != nil || image == "" {
				return nil, invalid("give the global ARG a default (ARG NAME=image before the first FROM), or write the image literally",
					"%s: FROM %s expands to no image name", where, n.Next.Value)
			}
			if !stages[strings.ToLower(image)] && !strings.EqualFold(image, "scratch") {
				add(image)
			}
			if as := n.Next.Next; as != nil && strings.EqualFold(as.Value, "as") && as.Next != nil {
				stages[strings.ToLower(as.Next.Value)] = true
			}
			nStages++
		case "copy":
			for _, f := range n.Flags {
				k, v, _ := strings.Cut(strings.TrimLeft(f, "-"), "=")
				if !strings.EqualFold(k, "from") || v == "" {
					continue
				}
				if strings.ContainsAny(v, "$") {
					return nil, invalid("write COPY --from literally: a stage's name or an image",
						"%s: COPY --from=%s is not literal: a variable could make it an image the engine pulls", where, v)
				}
				if idx, err := strconv.Atoi(v); (err == nil && idx >= 0 && idx < nStages) || stages[strings.ToLower(v)] {
					continue
				}
				add(v)
			}
		}
	}
	return out, nil
}
