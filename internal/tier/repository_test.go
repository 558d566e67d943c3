package tier

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// sentinel is a host value no diagnostic, and no sandbox block, may ever hold: it is put in the host's
// environment (SK_TIER_SENTINEL_VAR) and in a host file (the SENTINEL_FILE of a test).
const sentinel = "sk-tier-sentinel-7f3a91c2"

// testOperator is the operator of most cases: it defines npmrc and GITHUB_TOKEN, lists SK_TIER_LISTED for
// ${localEnv:...}, and allows nothing else.
func testOperator() Operator {
	return Operator{
		Secrets:     map[string]SecretSource{"npmrc": {FromEnv: "SK_TIER_SENTINEL_VAR"}},
		Credentials: map[string]CredentialSource{"GITHUB_TOKEN": {FromEnv: "SK_TIER_SENTINEL_VAR", Hosts: []string{"api.github.com"}}},
		LocalEnv:    []string{"SK_TIER_LISTED"},
	}
}

// want is one expected diagnostic.
type want struct {
	code  diag.Code
	sev   diag.Severity
	field string // exact
	hint  string // the operator setting the hint must name
	file  string // "sandkeep.yaml" or "devcontainer.json": the file it must be placed in, with a line
}

// fixture is a repository copied from testdata/TestRepository/<name> into a temporary directory, with
// ${REPO}, ${OUTSIDE} and ${SENTINEL_FILE} replaced in its files, a data/ directory, and the symlinks asked.
type fixture struct {
	repo, outside, sentinelFile string
}

func newFixture(t *testing.T, name string, links map[string]string) fixture {
	t.Helper()
	base := t.TempDir()
	fx := fixture{repo: filepath.Join(base, "repo"), outside: filepath.Join(base, "outside"), sentinelFile: filepath.Join(base, "host-secret")}
	for _, d := range []string{fx.repo, fx.outside, filepath.Join(fx.repo, "data")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(fx.sentinelFile, []byte(sentinel), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fx.outside, "secret.txt"), []byte(sentinel), 0o600); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join("testdata", "TestRepository", name)
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		dst := filepath.Join(fx.repo, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, []byte(fx.expand(string(b))), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	for link, target := range links {
		if err := os.Symlink(fx.expand(target), filepath.Join(fx.repo, link)); err != nil {
			t.Fatal(err)
		}
	}
	return fx
}

func (fx fixture) expand(s string) string {
	return strings.NewReplacer("${REPO}", fx.repo, "${OUTSIDE}", fx.outside, "${SENTINEL_FILE}", fx.sentinelFile).Replace(s)
}

// load reads the fixture's spec and fuses devcontainer.json when the spec names no image and no build, as
// cmd/sandkeep's loadSpec does, with the operator's local_env; it fails the test on a parser error.
func load(t *testing.T, fx fixture, op Operator, lookup func(string) (string, bool)) (spec.Sandbox, Sources, diag.List) {
	t.Helper()
	f, list := spec.Load(filepath.Join(fx.repo, "sandkeep.yaml"))
	if list.HasErrors() {
		t.Fatalf("spec: %v", diag.ListError(list))
	}
	sb, src := f.Sandbox, Sources{Spec: f}
	if sb.Image == "" && sb.Build == nil {
		dc, dlist, found := devcontainer.Load(f.Root, op.DevcontainerEnv(lookup, ""))
		list = append(list, dlist...)
		if found {
			if dlist.HasErrors() {
				t.Fatalf("devcontainer.json: %v", diag.ListError(dlist))
			}
			sb, _ = devcontainer.Fuse(dc, &sb, nil)
			src.Devcontainer = dc
		}
	}
	return sb, src, list
}

// TestRepository loads each repository of testdata/TestRepository through spec.Load (and devcontainer.Load
// with Fuse) and checks that Repository refuses exactly what the repository tier may not set, each with its
// code, the tier, the field, the file and line, and a hint naming the operator setting that would allow it;
// and that no diagnostic, nor the sandbox block, holds the host's sentinel value.
//
// devcontainer.json has no mode, secrets, network or host_state fields, so those refusals come from
// sandkeep.yaml only; its user and mounts are tested from both files.
func TestRepository(t *testing.T) {
	t.Setenv("SK_TIER_SENTINEL_VAR", sentinel)
	t.Setenv("SK_TIER_LISTED", "listed-value")
	const spec, dc = "sandkeep.yaml", "devcontainer.json"
	tests := []struct {
		name  string
		dir   string // under testdata/TestRepository; name when empty
		op    func(fx fixture, op *Operator)
		links map[string]string
		want  []want
	}{
		{name: "allowed-spec"},
		{name: "allowed-build"},
		{name: "dc-allowed"},
		{name: "mode-none", want: []want{{code: diag.TierModeNone, field: "sandbox.mode", hint: "SANDKEEP_SANDBOX_DEFAULT=none", file: spec}}},
		{name: "user", want: []want{{code: diag.TierUser, field: "sandbox.user", hint: "SANDKEEP_SANDBOX_USER", file: spec}}},
		{name: "dc-remote-user", want: []want{{code: diag.TierUser, field: "remoteUser", hint: "SANDKEEP_SANDBOX_USER", file: dc}}},
		{name: "dc-container-user", want: []want{{code: diag.TierUser, field: "containerUser", hint: "SANDKEEP_SANDBOX_USER", file: dc}}},
		{name: "mount-outside", want: []want{{code: diag.TierMountOutside, field: "sandbox.mounts[0]", hint: "host_paths", file: spec}}},
		{name: "dc-mount-outside", want: []want{
			{code: diag.TierMountOutside, field: "mounts[0]", hint: "host_paths", file: dc},
		}},
		{name: "mount-host-path", op: func(fx fixture, op *Operator) { op.HostPaths = []string{fx.outside} }},
		{name: "mount-host-path-refused", dir: "mount-host-path", op: func(fx fixture, op *Operator) {
			op.HostPaths = []string{"/"} // a host path the guard refuses holds nothing
		}, want: []want{{code: diag.TierMountOutside, field: "sandbox.mounts[0]", hint: "host_paths", file: spec}}},
		{name: "mount-host-path-file", dir: "mount-host-path", op: func(fx fixture, op *Operator) {
			op.HostPaths = []string{filepath.Join(fx.outside, "other")} // a sibling does not cover it
		}, want: []want{{code: diag.TierMountOutside, field: "sandbox.mounts[0]", hint: "host_paths", file: spec}}},
		{name: "mount-link-out", links: map[string]string{"link": "${OUTSIDE}"},
			want: []want{{code: diag.TierMountOutside, field: "sandbox.mounts[0]", hint: "host_paths", file: spec}}},
		{name: "mount-link-to-etc-ssl", dir: "mount-link-out", links: map[string]string{"link": "/etc/ssl"},
			want: []want{{code: diag.TierMountOutside, field: "sandbox.mounts[0]", hint: "host_paths", file: spec}}},
		{name: "mount-link-inside", dir: "mount-link-out", links: map[string]string{"link": "data"}},
		{name: "dc-mount-link-out", links: map[string]string{"link": "${OUTSIDE}"},
			want: []want{{code: diag.TierMountOutside, field: "mounts[0]", hint: "host_paths", file: dc}}},
		{name: "mount-writable", want: []want{{code: diag.TierMountWritable, sev: diag.Warning, field: "sandbox.mounts[0]", hint: "repo_mounts_writable", file: spec}}},
		{name: "mount-writable-allowed", dir: "mount-writable", op: func(_ fixture, op *Operator) { op.RepoMountsWritable = true }},
		{name: "dc-mount-writable", want: []want{{code: diag.TierMountWritable, sev: diag.Warning, field: "mounts[0]", hint: "repo_mounts_writable", file: dc}}},
		{name: "secret-from-env", want: []want{{code: diag.TierSecretSource, field: "sandbox.secret_files[0].from_env", hint: "secrets:", file: spec}}},
		{name: "secret-from-file", want: []want{{code: diag.TierSecretSource, field: "sandbox.secret_files[0].from_file", hint: "secrets:", file: spec}}},
		{name: "secret-unknown", want: []want{{code: diag.TierSecretUnknown, field: "sandbox.secret_files[0].name", hint: "secrets:", file: spec}}},
		{name: "credential-source", want: []want{
			{code: diag.TierCredentialSource, field: "sandbox.network.credentials[0].from_env", hint: "credentials:", file: spec},
			{code: diag.TierCredentialSource, field: "sandbox.network.credentials[0].hosts", hint: "credentials:", file: spec},
		}},
		{name: "credential-unknown", want: []want{{code: diag.TierCredentialUnknown, field: "sandbox.network.credentials[0].name", hint: "credentials:", file: spec}}},
		{name: "network-open", want: []want{{code: diag.TierNetworkOpen, field: "sandbox.network.mode", hint: "repo_network_open", file: spec}}},
		{name: "network-denylist", want: []want{{code: diag.TierNetworkOpen, field: "sandbox.network.mode", hint: "repo_network_open", file: spec}}},
		{name: "network-all-rule", want: []want{{code: diag.TierNetworkOpen, field: "sandbox.network.rules[0]", hint: "repo_network_open", file: spec}}},
		{name: "network-open-allowed", dir: "network-open", op: func(_ fixture, op *Operator) { op.RepoNetworkOpen = true }},
		{name: "network-all-rule-allowed", dir: "network-all-rule", op: func(_ fixture, op *Operator) { op.RepoNetworkOpen = true }},
		{name: "network-ip", want: []want{
			{code: diag.TierNetworkIPRule, field: "sandbox.network.rules[1]", hint: "repo_network_ip_rules", file: spec},
			{code: diag.TierNetworkIPRule, field: "sandbox.network.rules[2]", hint: "repo_network_ip_rules", file: spec},
		}},
		{name: "network-ip-allowed", dir: "network-ip", op: func(_ fixture, op *Operator) { op.RepoNetworkIPRules = true }},
		// Open and denylist modes, even with repo_network_open: an allowing IP rule unlocks loopback and the
		// metadata address there too; negations stay allowed.
		{name: "network-ip-open", op: func(_ fixture, op *Operator) { op.RepoNetworkOpen = true }, want: []want{
			{code: diag.TierNetworkIPRule, field: "sandbox.network.rules[1]", hint: "repo_network_ip_rules", file: spec},
			{code: diag.TierNetworkIPRule, field: "sandbox.network.rules[2]", hint: "repo_network_ip_rules", file: spec},
		}},
		{name: "network-ip-denylist", op: func(_ fixture, op *Operator) { op.RepoNetworkOpen = true }, want: []want{
			{code: diag.TierNetworkIPRule, field: "sandbox.network.rules[2]", hint: "repo_network_ip_rules", file: spec},
		}},
		{name: "network-ip-open-allowed", dir: "network-ip-open", op: func(_ fixture, op *Operator) { op.RepoNetworkOpen, op.RepoNetworkIPRules = true, true }},
		{name: "host-state", want: []want{{code: diag.TierHostState, field: "sandbox.host_state", hint: "host_state", file: spec}}},
		{name: "host-services", want: []want{{code: diag.TierHostServices, field: "sandbox.host_services", hint: "operator's config", file: spec},
			{code: diag.TierHostServices, field: "sandbox.services", hint: "template", file: spec}}},
		// Issue 22, finding 3: an operator who cannot accept builds' limits refuses them; allowed by default.
		{name: "build-refused", dir: "allowed-build", op: func(_ fixture, op *Operator) { op.RepoBuilds = RepoBuildsRefuse },
			want: []want{{code: diag.TierBuildRefused, field: "sandbox.build", hint: "repo_builds", file: spec}}},
		{name: "dc-build"},
		{name: "dc-build-refused", dir: "dc-build", op: func(_ fixture, op *Operator) { op.RepoBuilds = RepoBuildsRefuse },
			want: []want{
				{code: diag.TierBuildRefused, field: "build", hint: "repo_builds", file: dc},
				{code: diag.TierBuildRefused, field: "features", hint: "repo_builds", file: dc},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dir
			if dir == "" {
				dir = tt.name
			}
			fx := newFixture(t, dir, tt.links)
			op := testOperator()
			if tt.op != nil {
				tt.op(fx, &op)
			}
			sb, src, parsed := load(t, fx, op, os.LookupEnv)
			list := RepositoryFrom(&sb, fx.repo, op, src)
			if len(list) != len(tt.want) {
				t.Fatalf("got %d diagnostics, want %d:\n%s", len(list), len(tt.want), diag.ListError(list))
			}
			for i, w := range tt.want {
				d := list[i]
				sev := w.sev
				if sev == "" {
					sev = diag.Error
				}
				switch {
				case d.Code != w.code || d.Severity != sev:
					t.Errorf("diagnostic %d is %s %s, want %s %s: %s", i, d.Code, d.Severity, w.code, sev, d)
				case d.Tier != NameRepository || d.Field != w.field:
					t.Errorf("diagnostic %d has tier %q, field %q; want %q, %q: %s", i, d.Tier, d.Field, NameRepository, w.field, d)
				case !strings.Contains(d.Hint, w.hint):
					t.Errorf("diagnostic %d's hint does not name %q: %s", i, w.hint, d)
				case filepath.Base(d.File) != w.file || d.Line == 0 || d.Column == 0:
					t.Errorf("diagnostic %d is not placed in %s with a line and column: %s", i, w.file, d)
				case !strings.Contains(d.Message, NameRepository) && !strings.Contains(d.Message, "devcontainer.json"):
					t.Errorf("diagnostic %d's sentence does not say which tier set it: %s", i, d)
				case !strings.Contains(d.String(), "[tier repository, field "+w.field+"]"):
					t.Errorf("diagnostic %d's String does not show the tier and field: %s", i, d)
				}
			}
			// The same block without positions gives the same codes and fields.
			sb2, _, _ := load(t, fx, op, os.LookupEnv)
			plain := Repository(&sb2, fx.repo, op)
			if src.Devcontainer != nil && len(src.Devcontainer.Features) > 0 && op.RepoBuilds == RepoBuildsRefuse {
				plain = append(plain, diag.Diagnostic{}) // features are devcontainer.json's alone: not in the block
			}
			if len(plain) != len(list) {
				t.Errorf("Repository without sources: %d diagnostics, RepositoryFrom: %d", len(plain), len(list))
			}
			noSentinel(t, append(parsed, list...), sb)
		})
	}
}

// noSentinel fails when the host's sentinel value is in any diagnostic or in the sandbox block.
func noSentinel(t *testing.T, list diag.List, sb spec.Sandbox) {
	t.Helper()
	for _, d := range list {
		if strings.Contains(fmt.Sprintf("%s %+v", d, d), sentinel) {
			t.Errorf("a diagnostic holds the host's sentinel value: %s", d)
		}
	}
	if strings.Contains(fmt.Sprintf("%+v %+v %+v", sb, sb.Network, sb.Build), sentinel) {
		t.Errorf("the sandbox block holds the host's sentinel value: %+v", sb)
	}
}

// TestRepositoryWritableMadeReadOnly: a writable repository mount comes back read-only, from either file,
// and stays writable when the operator allows it.
func TestRepositoryWritableMadeReadOnly(t *testing.T) {
	for _, tc := range []struct {
		dir      string
		writable bool
	}{{"mount-writable", false}, {"dc-mount-writable", false}, {"mount-writable", true}} {
		t.Run(fmt.Sprintf("%s/writable=%v", tc.dir, tc.writable), func(t *testing.T) {
			fx := newFixture(t, tc.dir, nil)
			op := testOperator()
			op.RepoMountsWritable = tc.writable
			sb, src, _ := load(t, fx, op, nil)
			RepositoryFrom(&sb, fx.repo, op, src)
			if len(sb.Mounts) != 1 {
				t.Fatalf("mounts = %q", sb.Mounts)
			}
			ro := strings.HasSuffix(sb.Mounts[0], ",readonly")
			if ro == tc.writable {
				t.Errorf("mount = %q; want read-only %v", sb.Mounts[0], !tc.writable)
			}
			if want := "source=" + filepath.Join(fx.repo, "data") + ","; !strings.Contains(sb.Mounts[0], want) {
				t.Errorf("mount = %q lost its source", sb.Mounts[0])
			}
		})
	}
}

// TestRepositorySymlinkToEtc: a link inside the repository that points to /etc is refused as a source outside
// it (the spec parser's guard refuses /etc itself too; here the block is given to Repository directly, as a
// fused block or an API request would be).
func TestRepositorySymlinkToEtc(t *testing.T) {
	fx := newFixture(t, "allowed-build", map[string]string{"etc": "/etc", "deep": "data/../../outside"})
	op := testOperator()
	for _, tc := range []struct{ name, source string }{
		{"link to /etc", filepath.Join(fx.repo, "etc")},
		{"through a link to /etc", filepath.Join(fx.repo, "etc", "ssl")},
		{"relative link out", filepath.Join(fx.repo, "deep")},
		{"dot-dot", fx.repo + "/data/../../outside"},
		{"missing inside", filepath.Join(fx.repo, "nope")},
		{"root itself", "/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := spec.Sandbox{Image: "debian:12", Mounts: []string{"type=bind,source=" + tc.source + ",target=/opt/x,readonly"}}
			list := Repository(&sb, fx.repo, op)
			if len(list) != 1 || list[0].Code != diag.TierMountOutside || list[0].Field != "sandbox.mounts[0]" || list[0].Tier != NameRepository {
				t.Fatalf("want one SK502 on sandbox.mounts[0]; got\n%s", diag.ListError(list))
			}
		})
	}
	t.Run("no repository root", func(t *testing.T) {
		sb := spec.Sandbox{Mounts: []string{"type=bind,source=" + filepath.Join(fx.repo, "data") + ",target=/opt/x,readonly"}}
		if list := Repository(&sb, "", op); len(list) != 1 || list[0].Code != diag.TierMountOutside {
			t.Fatalf("want SK502 without a root; got %v", list)
		}
	})
	t.Run("a repository root that is a home directory", func(t *testing.T) {
		home := t.TempDir()
		if err := os.Mkdir(filepath.Join(home, ".ssh"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(home, ".bashrc"), []byte("# rc\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		sb := spec.Sandbox{Mounts: []string{"type=bind,source=" + filepath.Join(home, ".bashrc") + ",target=/opt/x,readonly"}}
		list := Repository(&sb, home, op)
		if len(list) != 1 || list[0].Code != diag.TierMountOutside || !strings.Contains(list[0].Message, "home directory") {
			t.Fatalf("want SK502 naming the home directory; got %v", list)
		}
	})
	t.Run("the repository itself", func(t *testing.T) {
		sb := spec.Sandbox{Mounts: []string{"type=bind,source=" + fx.repo + ",target=/opt/x,readonly"}}
		if list := Repository(&sb, fx.repo, op); len(list) != 0 {
			t.Fatalf("binding the repository root: %v", list)
		}
	})
}

// TestLocalEnv: a devcontainer.json's ${localEnv:...} reads only what the operator lists; the sentinel of an
// unlisted variable reaches neither the sandbox's env nor any diagnostic, and the warning names local_env.
func TestLocalEnv(t *testing.T) {
	t.Setenv("SK_TIER_SENTINEL_VAR", sentinel)
	t.Setenv("SK_TIER_LISTED", "listed-value")
	fx := newFixture(t, "dc-localenv", nil)
	op := testOperator()
	sb, src, list := load(t, fx, op, os.LookupEnv)
	if got := sb.Env["LISTED"]; got != "listed-value" {
		t.Errorf("listed variable expanded to %q", got)
	}
	if got, ok := sb.Env["LEAK"]; !ok || got != "" {
		t.Errorf("unlisted variable expanded to %q (set %v); want \"\"", got, ok)
	}
	var found bool
	for _, d := range list {
		if d.Code == diag.DevcontainerLocalEnvHidden {
			found = true
			if d.Severity != diag.Warning || !strings.Contains(d.Hint, "local_env") || d.Line == 0 {
				t.Errorf("SK217 = %s", d)
			}
		}
	}
	if !found {
		t.Errorf("no SK217 for the unlisted variable: %v", list)
	}
	noSentinel(t, append(list, RepositoryFrom(&sb, fx.repo, op, src)...), sb)

	lookup := op.LocalEnvLookup(os.LookupEnv)
	if v, ok := lookup("SK_TIER_SENTINEL_VAR"); ok || v != "" {
		t.Errorf("LocalEnvLookup let an unlisted name through: %q", v)
	}
	if v, ok := lookup("SK_TIER_LISTED"); !ok || v != "listed-value" {
		t.Errorf("LocalEnvLookup(listed) = %q, %v", v, ok)
	}
	if _, ok := op.LocalEnvLookup(nil)("SK_TIER_LISTED"); ok {
		t.Error("a nil lookup found a value")
	}
	if (Operator{}).LocalEnvListed("SK_TIER_LISTED") || !op.LocalEnvListed("SK_TIER_LISTED") {
		t.Error("LocalEnvListed")
	}
}
