package spec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/sandkeep/sandkeep/internal/diag"
)

// MaxFileSize bounds a spec file: a description of one sandbox, not a data file.
const MaxFileSize = 1 << 20

// Load reads and parses the spec file at path. File.Path is path as given; File.Root is its directory, made
// absolute. See Parse.
func Load(path string) (*File, diag.List) {
	data, err := readFile(path)
	if err != nil {
		return nil, diag.List{{
			Code: diag.SpecFile, Severity: diag.Error, File: path,
			Message: fmt.Sprintf("cannot read the spec file: %v", err),
			Hint:    "give the path of a readable sandkeep.yaml with --spec or SANDKEEP_SPEC",
		}}
	}
	return Parse(path, data)
}

// readFile reads at most MaxFileSize bytes of path, and fails on a longer file rather than cut it.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("it is larger than %d bytes", MaxFileSize)
	}
	return data, nil
}

// Parse parses data as the spec file at path, strictly: the file is one YAML mapping whose only key is
// `sandbox:`; unknown keys at any level, wrong types, duplicate keys, aliases and every value the checks of
// Validate refuse are diagnostics, each with the file, line and column of the offending node and a hint. All
// problems are reported, sorted by position. The *File is nil when any diagnostic is an Error; warnings (a
// mount source that does not exist yet) come with the file. File.Root is the absolute directory of path.
//
// Parse reads no file but does look at the host for mount sources (through guard.ParseMount).
func Parse(path string, data []byte) (*File, diag.List) {
	c := &checker{file: path, pos: map[string]*yaml.Node{}}
	f := &File{Path: path}
	if path != "" {
		if abs, err := filepath.Abs(path); err == nil {
			f.Root = filepath.Dir(abs)
		}
	}
	if root := decode(c, data); root != nil {
		p := &parser{c: c}
		p.file(root, &f.Sandbox)
		validate(&f.Sandbox, c)
	}
	sort.SliceStable(c.list, func(i, j int) bool {
		a, b := c.list[i], c.list[j]
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Column < b.Column
	})
	if c.list.HasErrors() {
		return nil, c.list
	}
	f.pos = c.pos
	return f, c.list
}

// syntaxLine finds the line in a yaml.v3 syntax error, which has no typed form. It only places the
// diagnostic; nothing is decided on the text.
var syntaxLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// decode returns the one document's root node, or nil after reporting why there is none.
func decode(c *checker, data []byte) (root *yaml.Node) {
	fileErr := func(line int, hint, format string, args ...any) {
		c.list = append(c.list, diag.Diagnostic{
			Code: diag.SpecFile, Severity: diag.Error, File: c.file, Line: line,
			Message: fmt.Sprintf(format, args...), Hint: hint,
		})
	}
	const startHint = "start the file with a line `sandbox:` and indent the fields under it"
	if len(data) > MaxFileSize {
		fileErr(0, "keep the spec under 1 MiB", "the spec file is larger than %d bytes", MaxFileSize)
		return nil
	}
	defer func() {
		// yaml.v3 has panicked on hostile input before; a spec file is input, so a panic is a refusal.
		if r := recover(); r != nil {
			fileErr(0, "check the file's YAML syntax", "the spec file cannot be parsed as YAML")
			root = nil
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			fileErr(1, startHint, "the spec file is empty")
			return nil
		}
		syntaxError(fileErr, err)
		return nil
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		fileErr(extra.Line, "keep one document: remove the second `---` and what follows", "the spec file holds more than one YAML document")
		return nil
	case !errors.Is(err, io.EOF):
		syntaxError(fileErr, err)
		return nil
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 || doc.Content[0].ShortTag() == "!!null" {
		fileErr(max(doc.Line, 1), startHint, "the spec file is empty")
		return nil
	}
	return doc.Content[0]
}

// syntaxError reports a YAML syntax error at its line.
func syntaxError(fileErr func(int, string, string, ...any), err error) {
	const hint = "fix the YAML syntax; quote values that start with *, !, &, @, ` or %, such as rules: [\"**.github.com\", \"!gist.github.com\"]"
	if m := syntaxLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		fileErr(line, hint, "the spec file is not valid YAML: %s", m[2])
		return
	}
	fileErr(0, hint, "the spec file is not valid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
}

// parser turns YAML nodes into a Sandbox, reporting structural problems (SK100, SK107-SK109) and recording
// each field's node in c.pos so that validate's diagnostics land on the right line.
type parser struct {
	c *checker
}

// Keys of each block, in the order the messages list them.
var (
	fileKeys      = []string{"sandbox"}
	sandboxKeys   = []string{"mode", "image", "build", "user", "env", "mounts", "tmpfs", "resources", "post_create", "workspace_folder", "host_state", "secret_files", "network", "services", "host_services"}
	buildKeys     = []string{"dockerfile", "context", "args"}
	resourceKeys  = []string{"cpus", "memory", "pids", "disk", "inodes"}
	secretKeys    = []string{"name", "path", "from_env", "from_file", "mode"}
	networkKeys   = []string{"mode", "preset", "rules", "inherit", "credentials", "inspect"}
	credKeys      = []string{"name", "from_env", "hosts", "header", "scheme", "fields", "allow_plaintext"}
	misplacedKeys = map[string]string{ // a key of a nested block written one level too high
		"dockerfile": "sandbox.build", "context": "sandbox.build", "args": "sandbox.build",
		"cpus": "sandbox.resources", "memory": "sandbox.resources", "pids": "sandbox.resources",
		"rules": "sandbox.network", "preset": "sandbox.network", "inherit": "sandbox.network",
	}
)

// forms are examples of each field, for hints.
var forms = map[string]string{
	"sandbox":                        "sandbox: {image: debian:12}",
	"sandbox.mode":                   "mode: auto",
	"sandbox.image":                  "image: debian:12",
	"sandbox.build":                  "build: {dockerfile: .devcontainer/Dockerfile, context: .}",
	"sandbox.build.dockerfile":       "dockerfile: .devcontainer/Dockerfile",
	"sandbox.build.context":          "context: .",
	"sandbox.build.args":             "args: {NODE_VERSION: \"20\"}",
	"sandbox.user":                   `user: "1000:1000"`,
	"sandbox.env":                    "env: {API_URL: https://example.com}",
	"sandbox.mounts":                 `mounts: ["type=bind,source=/abs/host/dir,target=/workspace/dir,readonly"]`,
	"sandbox.tmpfs":                  `tmpfs: ["/cache:size=64m"]`,
	"sandbox.resources":              "resources: {cpus: 1, memory: 2g, pids: 512}",
	"sandbox.resources.cpus":         "cpus: 1.5",
	"sandbox.resources.memory":       "memory: 2g",
	"sandbox.resources.pids":         "pids: 512",
	"sandbox.post_create":            `post_create: "make deps"`,
	"sandbox.workspace_folder":       "workspace_folder: /workspace",
	"sandbox.host_state":             "host_state: none",
	"sandbox.services":               "services: [mcp] (in an operator template, not here)",
	"sandbox.host_services":          "host_services: {mcp: {url: http://127.0.0.1:8931}} (in the operator's config, not here)",
	"sandbox.secret_files":           "secret_files: [{name: npmrc, path: /run/secrets/npmrc, from_env: NPM_RC}]",
	"sandbox.secret_files.name":      "name: npmrc",
	"sandbox.secret_files.path":      "path: /run/secrets/npmrc",
	"sandbox.secret_files.from_env":  "from_env: NPM_RC",
	"sandbox.secret_files.from_file": "from_file: /home/you/.npmrc",
	"sandbox.secret_files.mode":      `mode: "0400"`,
	"sandbox.network":                `network: {mode: allowlist, rules: ["**.github.com"]}`,
	"sandbox.network.mode":           "mode: allowlist",
	"sandbox.network.preset":         "preset: default",
	"sandbox.network.rules":          `rules: ["**.github.com", "!gist.github.com"]`,
	"sandbox.network.inherit":        "inherit: append",
	"sandbox.network.inspect":        "inspect: auto",
	"sandbox.network.credentials":    "credentials: [{name: GITHUB_TOKEN, from_env: GH_TOKEN, hosts: [api.github.com]}]",
}

// indexPart matches a list index in a field path.
var indexPart = regexp.MustCompile(`\[\d+\]`)

// formOf returns the example for a field path ("sandbox.mounts[2]" -> the mounts example).
func formOf(path string) string {
	p := indexPart.ReplaceAllString(path, "")
	for p != "" {
		if f, ok := forms[p]; ok {
			return f
		}
		i := strings.LastIndexByte(p, '.')
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return forms["sandbox"]
}

// file reads the top-level mapping.
func (p *parser) file(root *yaml.Node, s *Sandbox) {
	if !p.is(root, "the file", yaml.MappingNode) {
		return
	}
	var sandbox *yaml.Node
	p.mapping(root, "", "the file", fileKeys, func(key string, _, v *yaml.Node) {
		sandbox = v
	})
	if sandbox == nil {
		p.c.atNode(diag.Error, diag.SpecFile, root, "start the file with a line `sandbox:` and indent the fields under it",
			"the spec file has no sandbox block")
		return
	}
	if p.null(sandbox, "sandbox", "write sandbox: {} for an empty block, or give its fields") {
		return
	}
	if !p.is(sandbox, "sandbox", yaml.MappingNode) {
		return
	}
	p.sandbox(sandbox, s)
}

func (p *parser) sandbox(n *yaml.Node, s *Sandbox) {
	p.mapping(n, "sandbox", "sandbox", sandboxKeys, func(key string, _, v *yaml.Node) {
		path := "sandbox." + key
		switch key {
		case "mode":
			s.Mode, _ = p.str(v, path)
		case "image":
			s.Image, _ = p.str(v, path)
		case "build":
			if p.is(v, path, yaml.MappingNode) {
				s.Build = &Build{}
				p.build(v, s.Build)
			}
		case "user":
			if p.scalarOf(v, path, "a string", "!!str", "!!int") { // user: 1000 is a uid
				s.User = v.Value
			}
		case "env":
			s.Env = p.strMap(v, path)
		case "mounts":
			s.Mounts = p.strList(v, path)
		case "tmpfs":
			s.Tmpfs = p.strList(v, path)
		case "resources":
			if p.is(v, path, yaml.MappingNode) {
				s.Resources = &Resources{}
				p.resources(v, s.Resources)
			}
		case "post_create":
			s.PostCreate, _ = p.str(v, path)
		case "workspace_folder":
			s.WorkspaceFolder, _ = p.str(v, path)
		case "host_state":
			s.HostState, _ = p.str(v, path)
		case "services":
			s.Services = p.strList(v, path)
		case "host_services": // only its names are kept: a repository may not register any (tier.Repository)
			if p.is(v, path, yaml.MappingNode) {
				for i := 0; i+1 < len(v.Content); i += 2 {
					s.HostServices = append(s.HostServices, v.Content[i].Value)
				}
			}
		case "secret_files":
			s.SecretFiles = p.secretFiles(v, path)
		case "network":
			if p.is(v, path, yaml.MappingNode) {
				s.Network = &Network{}
				p.network(v, s.Network)
			}
		}
	})
}

func (p *parser) build(n *yaml.Node, b *Build) {
	p.mapping(n, "sandbox.build", "sandbox.build", buildKeys, func(key string, _, v *yaml.Node) {
		path := "sandbox.build." + key
		switch key {
		case "dockerfile":
			b.Dockerfile, _ = p.str(v, path)
		case "context":
			b.Context, _ = p.str(v, path)
		case "args":
			b.Args = p.strMap(v, path)
		}
	})
}

func (p *parser) resources(n *yaml.Node, r *Resources) {
	p.mapping(n, "sandbox.resources", "sandbox.resources", resourceKeys, func(key string, _, v *yaml.Node) {
		path := "sandbox.resources." + key
		switch key {
		case "cpus":
			if !p.scalarOf(v, path, "a number", "!!int", "!!float") {
				return
			}
			f, err := strconv.ParseFloat(v.Value, 64)
			if err != nil {
				p.c.atNode(diag.Error, diag.SpecResources, v, "write a plain decimal number of CPUs, e.g. "+formOf(path), "%s %q is not a decimal number", path, v.Value)
				return
			}
			if f == 0 { // zero would read as unset below: say so here, where it was written
				p.c.atNode(diag.Error, diag.SpecResources, v, cpusHint, "%s is 0; it must be more than 0", path)
			}
			r.CPUs = f
		case "memory":
			if v.Kind == yaml.ScalarNode && (v.ShortTag() == "!!int" || v.ShortTag() == "!!float") {
				p.c.atNode(diag.Error, diag.SpecResources, v, "give a unit: memory: "+v.Value+"m, or memory: 2g", "%s %s has no unit", path, v.Value)
				return
			}
			r.Memory, _ = p.str(v, path)
		case "disk":
			if v.Kind == yaml.ScalarNode && (v.ShortTag() == "!!int" || v.ShortTag() == "!!float") {
				p.c.atNode(diag.Error, diag.SpecResources, v, "give a unit: disk: "+v.Value+"m, or disk: 1g", "%s %s has no unit", path, v.Value)
				return
			}
			r.Disk, _ = p.str(v, path)
		case "inodes":
			if !p.scalarOf(v, path, "a whole number", "!!int") {
				return
			}
			n, err := strconv.ParseInt(v.Value, 10, 64)
			if err != nil || n <= 0 {
				p.c.atNode(diag.Error, diag.SpecResources, v, inodesHint, "%s %q is not a positive decimal whole number", path, v.Value)
				return
			}
			r.Inodes = n
		case "pids":
			if !p.scalarOf(v, path, "a whole number", "!!int") {
				return
			}
			n, err := strconv.ParseInt(v.Value, 10, 64)
			if err != nil {
				p.c.atNode(diag.Error, diag.SpecResources, v, "write a plain decimal number, e.g. "+formOf(path), "%s %q is not a decimal whole number", path, v.Value)
				return
			}
			if n == 0 {
				p.c.atNode(diag.Error, diag.SpecResources, v, pidsHint, "%s is 0; it must be at least %d", path, MinPids)
			}
			r.Pids = n
		}
	})
}

func (p *parser) secretFiles(n *yaml.Node, path string) []SecretFile {
	var out []SecretFile
	if n.Kind == yaml.SequenceNode {
		out = make([]SecretFile, 0, len(n.Content)) // secret_files: [] is an overlay's "none", not "unset"
	}
	p.mappings(n, path, secretKeys, func(ipath string) func(key string, v *yaml.Node) {
		out = append(out, SecretFile{})
		sf := &out[len(out)-1]
		return func(key string, v *yaml.Node) {
			kpath := ipath + "." + key
			switch key {
			case "name":
				sf.Name, _ = p.str(v, kpath)
			case "path":
				sf.Path, _ = p.str(v, kpath)
			case "from_env":
				sf.FromEnv, _ = p.str(v, kpath)
			case "from_file":
				sf.FromFile, _ = p.str(v, kpath)
			case "mode":
				if p.scalarOf(v, kpath, "an octal mode", "!!str", "!!int") {
					sf.Mode = v.Value // as written: "0400", not the number YAML may read it as
				}
			}
		}
	})
	return out
}

// mappings walks a sequence of mappings at path (secret files, credentials): item(ipath) is called once per
// mapping item and returns the setter for its keys, used before the next item is called.
func (p *parser) mappings(n *yaml.Node, path string, keys []string, item func(ipath string) func(key string, v *yaml.Node)) {
	if !p.is(n, path, yaml.SequenceNode) {
		return
	}
	for i, it := range n.Content {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		p.c.pos[ipath] = it
		if !p.is(it, ipath, yaml.MappingNode) {
			continue
		}
		set := item(ipath)
		p.mapping(it, ipath, ipath, keys, func(key string, _, v *yaml.Node) { set(key, v) })
	}
}

func (p *parser) network(n *yaml.Node, nw *Network) {
	p.mapping(n, "sandbox.network", "sandbox.network", networkKeys, func(key string, _, v *yaml.Node) {
		path := "sandbox.network." + key
		switch key {
		case "mode":
			nw.Mode, _ = p.str(v, path)
		case "preset":
			nw.Preset, _ = p.str(v, path)
		case "rules":
			nw.Rules = p.strList(v, path)
		case "inherit":
			nw.Inherit, _ = p.str(v, path)
		case "inspect":
			nw.Inspect, _ = p.str(v, path)
		case "credentials":
			nw.Credentials = p.credentials(v, path)
		}
	})
}

func (p *parser) credentials(n *yaml.Node, path string) []NetworkCredential {
	var out []NetworkCredential
	if n.Kind == yaml.SequenceNode {
		out = make([]NetworkCredential, 0, len(n.Content))
	}
	p.mappings(n, path, credKeys, func(ipath string) func(key string, v *yaml.Node) {
		out = append(out, NetworkCredential{})
		c := &out[len(out)-1]
		return func(key string, v *yaml.Node) {
			kpath := ipath + "." + key
			switch key {
			case "name":
				c.Name, _ = p.str(v, kpath)
			case "from_env":
				c.FromEnv, _ = p.str(v, kpath)
			case "hosts":
				c.Hosts = p.strList(v, kpath)
			case "header":
				c.Header, _ = p.str(v, kpath)
			case "scheme":
				c.Scheme, _ = p.str(v, kpath)
			case "fields":
				c.Fields = p.strList(v, kpath)
			case "allow_plaintext":
				if p.scalarOf(v, kpath, "true or false", "!!bool") {
					c.AllowPlaintext = v.Value == "true" || v.Value == "True" || v.Value == "TRUE"
				}
			}
		}
	})
	return out
}

// mapping walks the key/value pairs of n (already known to be a mapping), reports non-scalar, duplicate and
// unknown keys, records each known value's node at path.key, and calls set for it.
func (p *parser) mapping(n *yaml.Node, path, block string, keys []string, set func(key string, k, v *yaml.Node)) {
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if p.alias(k) {
			continue
		}
		if k.Kind != yaml.ScalarNode {
			p.c.atNode(diag.Error, diag.SpecWrongType, k, "write a plain name as the key", "a key in %s is %s, not a name", block, describe(k))
			continue
		}
		key := k.Value
		if first, dup := seen[key]; dup {
			p.c.atNode(diag.Error, diag.SpecDuplicateKey, k, "keep one of them",
				"duplicate key %q in %s (first at line %d)", key, block, first.Line)
			continue
		}
		seen[key] = k
		if !contains(keys, key) {
			p.c.atNode(diag.Error, diag.SpecUnknownField, k, unknownHint(key, keys),
				"unknown field %q in %s: want one of %s", key, block, strings.Join(keys, ", "))
			continue
		}
		fpath := key
		if path != "" {
			fpath = path + "." + key
		}
		p.c.pos[fpath] = v
		if p.alias(v) {
			continue
		}
		set(key, k, v)
	}
}

// unknownHint suggests the key that was probably meant.
func unknownHint(key string, keys []string) string {
	if key == "<<" {
		return "YAML merge keys are not supported: write the fields out"
	}
	best, bestDist := "", 3
	for _, k := range keys {
		if d := editDistance(strings.ToLower(key), k); d < bestDist {
			best, bestDist = k, d
		}
	}
	if best != "" {
		return fmt.Sprintf("did you mean %q?", best)
	}
	if block, ok := misplacedKeys[key]; ok {
		return fmt.Sprintf("%s belongs under %s", key, block)
	}
	return "remove it, or fix its spelling"
}

// editDistance is the Levenshtein distance between two short strings.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// alias refuses an alias node: an alias makes one node stand for many, which this format does not need and
// which would let a small file expand into a large one.
func (p *parser) alias(n *yaml.Node) bool {
	if n.Kind != yaml.AliasNode {
		return false
	}
	p.c.atNode(diag.Error, diag.SpecFile, n, "write the value out instead of *"+n.Value, "YAML aliases are not supported (*%s)", n.Value)
	return true
}

// null reports a null value for path and returns true.
func (p *parser) null(n *yaml.Node, path, hint string) bool {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!null" {
		return false
	}
	p.c.atNode(diag.Error, diag.SpecWrongType, n, hint, "%s has no value", path)
	return true
}

// is reports whether n has the kind wanted, and otherwise reports a wrong type for path.
func (p *parser) is(n *yaml.Node, path string, want yaml.Kind) bool {
	if n.Kind == want {
		return true
	}
	if p.alias(n) {
		return false
	}
	if p.null(n, path, "give a value, e.g. "+formOf(path)+", or remove the line") {
		return false
	}
	p.c.atNode(diag.Error, diag.SpecWrongType, n, "write it as "+formOf(path), "%s must be %s, not %s", path, kindName(want), describe(n))
	return false
}

// scalarOf reports whether n is a scalar with one of the tags, and otherwise reports a wrong type.
func (p *parser) scalarOf(n *yaml.Node, path, what string, tags ...string) bool {
	if n.Kind == yaml.ScalarNode && contains(tags, n.ShortTag()) {
		return true
	}
	if p.alias(n) || p.null(n, path, "give a value, e.g. "+formOf(path)+", or remove the line") {
		return false
	}
	hint := "write it as " + formOf(path)
	if n.Kind == yaml.ScalarNode && contains(tags, "!!str") {
		hint = fmt.Sprintf("quote it: %q", n.Value)
	}
	if localTag(n) {
		hint = fmt.Sprintf("quote a value that starts with '!': %q", n.Tag+n.Value)
		if n.Value != "" {
			hint = fmt.Sprintf("quote a value that starts with '!': %q", n.Tag+" "+n.Value)
		}
	}
	p.c.atNode(diag.Error, diag.SpecWrongType, n, hint, "%s must be %s, not %s", path, what, describe(n))
	return false
}

// localTag reports whether n carries a local tag such as !gist.github.com: an unquoted value that starts
// with '!', which YAML reads as a tag.
func localTag(n *yaml.Node) bool {
	return strings.HasPrefix(n.Tag, "!") && !strings.HasPrefix(n.Tag, "!!")
}

// str reads a string scalar.
func (p *parser) str(n *yaml.Node, path string) (string, bool) {
	if !p.scalarOf(n, path, "a string", "!!str") {
		return "", false
	}
	return n.Value, true
}

// scalar reads a string, or a number or boolean as its literal text (env: {PORT: 8080, DEBUG: true}), the way
// people write them in YAML; the text is kept exactly as written (1.10 stays "1.10").
func (p *parser) scalar(n *yaml.Node, path string) (string, bool) {
	if !p.scalarOf(n, path, "a string", "!!str", "!!int", "!!float", "!!bool") {
		return "", false
	}
	return n.Value, true
}

// strList reads a list of strings, recording each item's node at path[i].
func (p *parser) strList(n *yaml.Node, path string) []string {
	if !p.is(n, path, yaml.SequenceNode) {
		return nil
	}
	out := make([]string, 0, len(n.Content))
	for i, item := range n.Content {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		p.c.pos[ipath] = item
		if s, ok := p.str(item, ipath); ok {
			out = append(out, s)
		}
	}
	return out
}

// strMap reads a mapping of names to scalars (env, build args), recording each key's node at path.name.
func (p *parser) strMap(n *yaml.Node, path string) map[string]string {
	if !p.is(n, path, yaml.MappingNode) {
		return nil
	}
	out := make(map[string]string, len(n.Content)/2)
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if p.alias(k) {
			continue
		}
		if k.Kind != yaml.ScalarNode {
			p.c.atNode(diag.Error, diag.SpecWrongType, k, "write a plain name as the key", "a key in %s is %s, not a name", path, describe(k))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			p.c.atNode(diag.Error, diag.SpecDuplicateKey, k, "keep one of them", "duplicate key %q in %s (first at line %d)", k.Value, path, first.Line)
			continue
		}
		seen[k.Value] = k
		kpath := path + "." + k.Value
		p.c.pos[kpath] = k
		if s, ok := p.scalar(v, kpath); ok {
			out[k.Value] = s
		}
	}
	return out
}

// kindName names a node kind for a message.
func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return "a single value"
	case yaml.AliasNode:
		return "an alias"
	}
	return "a document"
}

// describe names what n is, for "must be X, not Y".
func describe(n *yaml.Node) string {
	if n.Kind != yaml.ScalarNode {
		return kindName(n.Kind)
	}
	if localTag(n) {
		return "a value tagged " + strconv.Quote(n.Tag)
	}
	switch n.ShortTag() {
	case "!!str":
		return "a string"
	case "!!int", "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	case "!!null":
		return "null"
	case "!!timestamp":
		return "a timestamp"
	case "!!binary":
		return "binary data"
	}
	return "a value tagged " + strconv.Quote(n.Tag)
}
