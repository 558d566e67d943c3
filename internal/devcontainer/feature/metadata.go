package feature

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// MetadataFile is the name of a feature's metadata, at the root of its directory or archive.
const MetadataFile = "devcontainer-feature.json"

// InstallScript is the script run as root at build time.
const InstallScript = "install.sh"

// MaxMetadataBytes bounds devcontainer-feature.json.
const MaxMetadataBytes = 1 << 20

// Metadata is what sandkeep reads of devcontainer-feature.json. Other fields (name, description,
// documentationURL, customizations, keywords, ...) are ignored.
type Metadata struct {
	ID            string                     `json:"id"`
	Version       string                     `json:"version"`
	Options       map[string]Option          `json:"options"`
	ContainerEnv  map[string]string          `json:"containerEnv"`
	Mounts        []json.RawMessage          `json:"mounts"` // {type, source, target} objects or --mount strings
	InstallsAfter []string                   `json:"installsAfter"`
	DependsOn     map[string]json.RawMessage `json:"dependsOn"` // feature -> its options

	// Asked for, never obeyed (Plan drops and reports them).
	Privileged  *bool    `json:"privileged"`
	CapAdd      []string `json:"capAdd"`
	SecurityOpt []string `json:"securityOpt"`
	Init        *bool    `json:"init"`
	Entrypoint  string   `json:"entrypoint"`

	// Lifecycle commands of a feature: not run (Plan reports them).
	OnCreateCommand      json.RawMessage `json:"onCreateCommand"`
	UpdateContentCommand json.RawMessage `json:"updateContentCommand"`
	PostCreateCommand    json.RawMessage `json:"postCreateCommand"`
	PostStartCommand     json.RawMessage `json:"postStartCommand"`
	PostAttachCommand    json.RawMessage `json:"postAttachCommand"`
}

// Option is one declared option: a string or a boolean with a default.
type Option struct {
	Type    string          `json:"type"`    // "string" or "boolean"
	Default json.RawMessage `json:"default"` // a string or a boolean
	Enum    []string        `json:"enum"`    // when set, a string option must be one of these
}

var featureID = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,128}$`)

// ParseMetadata reads devcontainer-feature.json strictly: one JSON object, id and version present, options
// of type string or boolean with defaults of that type, names that make environment variables. Errors are
// FEATURE_INVALID naming what (the feature's reference as written) and the field.
func ParseMetadata(what string, data []byte) (*Metadata, error) {
	bad := func(hint, format string, args ...any) error {
		return fault.New(fault.FeatureInvalid, hint, "feature %q: %s: %s", what, MetadataFile, fmt.Sprintf(format, args...))
	}
	if len(data) > MaxMetadataBytes {
		return nil, bad("keep devcontainer-feature.json under 1 MiB", "it is %d bytes", len(data))
	}
	var m Metadata
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&m); err != nil {
		return nil, bad("make it one JSON object as the devcontainer features spec describes", "%v", err)
	}
	if dec.More() {
		return nil, bad("make it one JSON object", "there is more after the object")
	}
	if !featureID.MatchString(m.ID) {
		return nil, bad(`set "id" to the feature's directory name`, "id %q is missing or not [a-zA-Z0-9_-]", m.ID)
	}
	if m.Version == "" || len(m.Version) > 128 {
		return nil, bad(`set "version", such as "1.0.0"`, "version is missing or too long")
	}
	seen := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(m.Options)) {
		o := m.Options[name]
		env := EnvName(name)
		if env == "" {
			return nil, bad("name options with letters, digits and _", "option %q makes no environment variable name", name)
		}
		if other, dup := seen[env]; dup {
			return nil, bad("rename one of them", "options %q and %q both become %s", other, name, env)
		}
		seen[env] = name
		switch o.Type {
		case "string", "boolean":
		default:
			return nil, bad(`give the option "type": "string" or "boolean"`, "option %q has type %q", name, o.Type)
		}
		if len(o.Default) > 0 {
			if _, err := optionValue(o, o.Default); err != nil {
				return nil, bad("make the default match the option's type", "option %q default: %v", name, err)
			}
		}
	}
	for k, v := range m.ContainerEnv {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, bad("use plain variable names and values", "containerEnv has a malformed entry")
		}
	}
	return &m, nil
}

// EnvName is the environment variable an option is given in, as the devcontainers CLI names it: every
// character that is not a letter, digit or _ becomes _, a leading run of digits and _ becomes one _, and the
// result is upper-cased. "" when nothing is left.
func EnvName(option string) string {
	var b strings.Builder
	for _, c := range option {
		if c < 0x80 && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	s := b.String()
	if t := strings.TrimLeft(s, "0123456789_"); len(t) != len(s) {
		s = "_" + t
	}
	if s == "_" || s == "" {
		return ""
	}
	return strings.ToUpper(s)
}

// optionValue turns a JSON value given for (or as the default of) an option into its string form: a string
// stays as written, a boolean is "true" or "false". A string option's enum is enforced.
func optionValue(o Option, raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	var s string
	switch {
	case len(raw) > 0 && raw[0] == '"':
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		if o.Type == "boolean" && s != "true" && s != "false" {
			return "", fmt.Errorf("%q is not a boolean", short(s))
		}
	case string(raw) == "true" || string(raw) == "false":
		s = string(raw)
	default:
		return "", fmt.Errorf("%s is neither a string nor a boolean", short(string(raw)))
	}
	if strings.ContainsRune(s, 0) || len(s) > 4096 {
		return "", fmt.Errorf("the value has a NUL byte or is longer than 4096 bytes")
	}
	if o.Type == "string" && len(o.Enum) > 0 && !slices.Contains(o.Enum, s) {
		return "", fmt.Errorf("%q is not one of %s", short(s), strconv.Quote(strings.Join(o.Enum, ", ")))
	}
	return s, nil
}

func short(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}
