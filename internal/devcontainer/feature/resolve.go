package feature

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// Bounds of what one feature may ship, and of how many features one file may pull in (dependsOn included).
const (
	MaxFeatureBytes int64 = 256 << 20
	MaxFeatureFiles       = 10_000
	MaxFeatures           = 32
)

// Requested is one entry of devcontainer.json's "features": the name as written and its value (an object of
// options, or a string that is the "version" option, as the devcontainers CLI reads it).
type Requested struct {
	ID      string
	Options json.RawMessage
}

// File is one file a feature ships: its content in Data, or, when it was spooled to disk, in a file of the
// resolution's Spool (read it with Open).
type File struct {
	Path string // slash-separated, relative to the feature's root, clean and local
	Mode fs.FileMode
	Data []byte
	Size int64 // the content's length, in Data or on disk

	spooled string // the spool file holding the content; "" when it is Data
}

// Feature is one resolved feature: where it came from, its metadata, its files and the options it is given.
type Feature struct {
	Ref     Ref
	Meta    *Metadata
	Files   []File            // sorted by Path; devcontainer-feature.json and install.sh among them
	Digest  string            // OCI: the manifest's digest; local: sha256 of the files
	Options map[string]string // environment name -> value: declared defaults, then the file's values
}

// Fetcher brings an OCI feature's files, taking them into sp (which bounds them all). Registry (oci.go) is
// the real one.
type Fetcher interface {
	Fetch(ctx context.Context, ref Ref, sp *Spool) (files []File, digest string, err error)
}

// Source is where features are read from.
type Source struct {
	Repo    *os.Root // the repository root; local features are read through it
	DcDir   string   // devcontainer.json's directory relative to the repository root, slash-separated
	Fetcher Fetcher  // OCI features; nil: an OCI feature fails with FEATURE_UNAVAILABLE
	// Spool holds the files read; nil keeps them in memory. Either way they are bounded together
	// (MaxTotalFeatureBytes).
	Spool *Spool
}

// Resolve reads every requested feature (and the features their dependsOn names that the file does not),
// gives each its options, and returns them in install order (Order). Errors are FEATURE_INVALID or
// FEATURE_UNAVAILABLE naming the feature, or wrap ctx's cause.
func Resolve(ctx context.Context, src Source, req []Requested) ([]*Feature, error) {
	release, err := acquireResolve(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	if src.Spool == nil {
		src.Spool = &Spool{}
	}
	var out []*Feature
	byResource := map[string]*Feature{}
	queue := slices.Clone(req)
	for len(queue) > 0 {
		r := queue[0]
		queue = queue[1:]
		ref, err := ParseRef(r.ID, src.DcDir)
		if err != nil {
			return nil, err
		}
		if byResource[ref.Resource()] != nil {
			continue // named twice (a dependency the file also lists): the file's entry came first
		}
		if len(out) == MaxFeatures {
			return nil, invalid(r.ID, "install fewer features, or build an image that has them", "more than %d features (dependsOn included)", MaxFeatures)
		}
		f, err := load(ctx, src, ref)
		if err != nil {
			return nil, err
		}
		if f.Options, err = options(f, r.Options); err != nil {
			return nil, err
		}
		out = append(out, f)
		byResource[ref.Resource()] = f
		for _, dep := range slices.Sorted(maps.Keys(f.Meta.DependsOn)) {
			queue = append(queue, Requested{ID: dep, Options: f.Meta.DependsOn[dep]})
		}
	}
	return Order(out, src.DcDir)
}

// load reads one feature's files and metadata.
func load(ctx context.Context, src Source, ref Ref) (*Feature, error) {
	var files []File
	var digest string
	var err error
	switch {
	case ref.IsLocal():
		if src.Repo == nil {
			return nil, invalid(ref.ID, "run from the repository", "no repository to read a local feature from")
		}
		files, err = readLocal(src.Repo, ref, src.Spool)
		if err == nil {
			digest, err = filesDigest(files)
		}
	case src.Fetcher == nil:
		return nil, fault.New(fault.FeatureUnavailable, "vendor the feature into .devcontainer/ and name it \"./dir\", or let the operator configure a registry client",
			"feature %q: no registry client is configured to fetch it from %s", ref.ID, ref.Registry)
	default:
		files, digest, err = src.Fetcher.Fetch(ctx, ref, src.Spool)
	}
	if err != nil {
		return nil, err
	}
	slices.SortFunc(files, func(a, b File) int { return cmp.Compare(a.Path, b.Path) })
	var meta []byte
	hasInstall := false
	for _, f := range files {
		switch f.Path {
		case MetadataFile:
			if meta, err = f.Bytes(); err != nil {
				return nil, err
			}
		case InstallScript:
			hasInstall = f.Mode.IsRegular()
		}
	}
	if meta == nil {
		return nil, invalid(ref.ID, "add devcontainer-feature.json at the feature's root", "%s is missing", MetadataFile)
	}
	if !hasInstall {
		return nil, invalid(ref.ID, "add install.sh at the feature's root", "%s is missing", InstallScript)
	}
	m, err := ParseMetadata(ref.ID, meta)
	if err != nil {
		return nil, err
	}
	return &Feature{Ref: ref, Meta: m, Files: files, Digest: digest}, nil
}

// readLocal reads a local feature's directory through the repository root. Symlinks and special files are
// refused: a feature's files are copied into an image, and a link would name something else there.
func readLocal(repo *os.Root, ref Ref, sp *Spool) ([]File, error) {
	dir, err := repo.OpenRoot(ref.Local)
	if err != nil {
		return nil, fault.Wrap(err, fault.FeatureInvalid, "create the directory next to devcontainer.json, with devcontainer-feature.json and install.sh",
			"feature %q: cannot open %s: %v", ref.ID, ref.Local, errors.Unwrap(err))
	}
	defer dir.Close()
	var files []File
	var total int64
	err = fs.WalkDir(dir.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == "." || d.IsDir() {
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is a %s; a feature ships only regular files and directories", p, d.Type())
		}
		if len(files) == MaxFeatureFiles {
			return fmt.Errorf("more than %d files", MaxFeatureFiles)
		}
		fh, err := dir.Open(p)
		if err != nil {
			return err
		}
		defer fh.Close()
		st, err := fh.Stat()
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file", p)
		}
		f, err := sp.take(p, st.Mode()&0o777, fh, MaxFeatureBytes-total)
		if err != nil {
			return err
		}
		total += f.Size
		files = append(files, f)
		return nil
	})
	if err != nil {
		return nil, fault.Wrap(err, fault.FeatureInvalid, "keep the feature's directory to regular files, within the bounds",
			"feature %q: %v", ref.ID, err)
	}
	return files, nil
}

// filesDigest is the sha256 of the files' paths, modes and contents.
func filesDigest(files []File) (string, error) {
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%q %o %d\n", f.Path, f.Mode, f.Size)
		rc, err := f.Open()
		if err != nil {
			return "", err
		}
		_, err = io.Copy(h, rc)
		rc.Close()
		if err != nil {
			return "", err
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// options gives the feature its environment: every declared option's default, then the values the file gives
// (a string value is the "version" option). A value for an option the feature does not declare is refused:
// the CLI would pass it on, but an undeclared name is most often a typo that would install the wrong thing.
func options(f *Feature, raw json.RawMessage) (map[string]string, error) {
	env := map[string]string{}
	for name, o := range f.Meta.Options {
		if len(o.Default) == 0 {
			continue
		}
		v, _ := optionValue(o, o.Default) // checked by ParseMetadata
		env[EnvName(name)] = v
	}
	raw = bytes.TrimSpace(raw)
	given := map[string]json.RawMessage{}
	switch {
	case len(raw) == 0 || string(raw) == "null":
	case raw[0] == '"':
		given["version"] = raw
	case raw[0] == '{':
		if err := json.Unmarshal(raw, &given); err != nil {
			return nil, invalid(f.Ref.ID, "give options as an object of strings and booleans", "options: %v", err)
		}
	case string(raw) == "true":
		// the legacy "feature": true means "with its defaults"
	default:
		return nil, invalid(f.Ref.ID, "give options as an object: {\"version\": \"1.22\"}", "options must be an object or a version string")
	}
	for _, name := range slices.Sorted(maps.Keys(given)) {
		o, ok := f.Meta.Options[name]
		if !ok {
			return nil, invalid(f.Ref.ID, "use one of the options devcontainer-feature.json declares: "+strings.Join(slices.Sorted(maps.Keys(f.Meta.Options)), ", "),
				"option %q is not declared", name)
		}
		v, err := optionValue(o, given[name])
		if err != nil {
			return nil, invalid(f.Ref.ID, "give a value of the option's type", "option %q: %v", name, err)
		}
		env[EnvName(name)] = v
	}
	return env, nil
}

// Order returns features in install order: a feature after every feature it dependsOn (hard: it is present,
// Resolve fetched it) and after the features its installsAfter names that are present (soft). Among features
// free to go, the one named first goes first. Local names are read relative to dcDir (see ParseRef). A cycle
// is FEATURE_INVALID.
func Order(fs []*Feature, dcDir string) ([]*Feature, error) {
	index := map[string]int{}
	for i, f := range fs {
		index[f.Ref.Resource()] = i
	}
	after := make([][]int, len(fs)) // after[i]: the features i waits for
	for i, f := range fs {
		names := slices.Clone(f.Meta.InstallsAfter)
		names = append(names, slices.Sorted(maps.Keys(f.Meta.DependsOn))...)
		for _, n := range names {
			r, err := ParseRef(n, dcDir)
			if err != nil {
				continue // a name that is no feature we could have: installsAfter is advisory
			}
			if j, ok := index[r.Resource()]; ok && j != i {
				after[i] = append(after[i], j)
			}
		}
	}
	done := make([]bool, len(fs))
	out := make([]*Feature, 0, len(fs))
	for len(out) < len(fs) {
		progressed := false
		for i, f := range fs {
			if done[i] || slices.ContainsFunc(after[i], func(j int) bool { return !done[j] }) {
				continue
			}
			done[i], progressed = true, true
			out = append(out, f)
			break // restart from the first: the earliest-named free feature goes next
		}
		if !progressed {
			var stuck []string
			for i, f := range fs {
				if !done[i] {
					stuck = append(stuck, path.Base(f.Ref.ID))
				}
			}
			return nil, invalid(fs[0].Ref.ID, "remove one of the installsAfter or dependsOn entries that form the cycle",
				"the features %s wait for each other", strings.Join(stuck, ", "))
		}
	}
	return out, nil
}
