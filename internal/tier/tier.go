// Package tier: TEMPORARY interface placeholder, replaced by the tier branch before anything lands.
package tier

import (
	"os"

	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/spec"
)

type Operator struct {
	Secrets            map[string]SecretSource     `yaml:"secrets"`
	Credentials        map[string]CredentialSource `yaml:"credentials"`
	HostPaths          []string                    `yaml:"host_paths"`
	RepoMountsWritable bool                        `yaml:"repo_mounts_writable"`
	LocalEnv           []string                    `yaml:"local_env"`
	RepoNetworkOpen    bool                        `yaml:"repo_network_open"`
	RepoNetworkIPRules bool                        `yaml:"repo_network_ip_rules"`
}
type SecretSource struct{ FromEnv, FromFile string }
type CredentialSource struct {
	FromEnv string
	Hosts   []string
}

func (op Operator) Validate() error                                   { return nil }
func Repository(sb *spec.Sandbox, root string, op Operator) diag.List { return nil }
func (op Operator) LocalEnvLookup(l func(string) (string, bool)) func(string) (string, bool) {
	return l
}

type ResolvedSecret struct {
	Name, Path string
	Mode       os.FileMode
	Value      []byte
}

func (op Operator) ResolveSecrets(files []spec.SecretFile) ([]ResolvedSecret, error) { return nil, nil }

type ResolvedCredential struct {
	Name, Value string
	Hosts       []string
}

func (op Operator) ResolveCredentials(refs []spec.NetworkCredential) ([]ResolvedCredential, error) {
	return nil, nil
}
