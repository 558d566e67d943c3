package tier_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/spec"
	"github.com/sandkeep/sandkeep/internal/tier"
)

// The admission pipeline's use: load the repository's spec, fuse its devcontainer.json with the operator's
// local_env, check the fused block against the operator before the operator's overlay, then resolve the
// names it referenced.
func Example() {
	op, list, err := tier.ParseOperator([]byte("secrets: {npmrc: {from_env: NPM_RC}}\nlocal_env: [NODE_VERSION]\n"))
	if err != nil || list.HasErrors() {
		fmt.Println(err, list)
		return
	}
	op.LookupEnv = func(name string) (string, bool) {
		return map[string]string{"NPM_RC": "//registry/:_authToken=x"}[name], name == "NPM_RC"
	}

	f, list := spec.Load(filepath.Join("testdata", "TestRepository", "dc-remote-user", "sandkeep.yaml"))
	if list.HasErrors() {
		fmt.Println(list)
		return
	}
	sb, src := f.Sandbox, tier.Sources{Spec: f}
	if sb.Image == "" && sb.Build == nil {
		if dc, _, found := devcontainer.Load(f.Root, op.DevcontainerEnv(os.LookupEnv, "")); found && dc != nil {
			sb, _ = devcontainer.Fuse(dc, &sb, nil)
			src.Devcontainer = dc
		}
	}
	for _, d := range tier.RepositoryFrom(&sb, f.Root, op, src) {
		fmt.Printf("%s %s %s %s line %d\n", d.Code, d.Severity, d.Tier, d.Field, d.Line)
	}

	secrets, err := op.ResolveSecrets([]spec.SecretFile{{Name: "npmrc", Path: "/run/secrets/npmrc"}})
	fmt.Println(secrets, err)
	// Output:
	// SK501 error repository remoteUser line 3
	// [secret npmrc at /run/secrets/npmrc (24 bytes)] <nil>
}
