package engine

import (
	"slices"
	"sort"
	"time"

	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
	"github.com/sandkeep/sandkeep/internal/spec"
	"github.com/sandkeep/sandkeep/internal/tier"
)

// Template is an operator-defined sandbox shape that a caller picks by name (RunRequest.Template, the API's and
// MCP's template field). Its fields replace the Config's for the runs that use it; zero fields keep the
// Config's. A sandbox remembers its template: asking for another recycles it.
type Template struct {
	Image       string   // image ref; "" keeps Config.Image
	User        string   // sandbox "uid:gid"
	CPUs        float64  //
	MemoryBytes int64    //
	PidsLimit   int64    //
	Env         []string // added to the Config's, "K=V"
	PostCreate  string
	// Spec is a repository spec (sandkeep.yaml) the template's runs follow when the request names none. It is
	// the repository tier, checked against Config.Repository like any other.
	Spec string
	// Network is added to Config.Network (Inherit: append or replace); its credentials are the operator's values.
	Network *Network
	// Secrets are secret files by the operator's names (Config.Repository.Secrets), delivered to every command.
	Secrets []TemplateSecret
	// Tenants may use the template; empty: every tenant.
	Tenants []string
	// Pool is how many sandboxes of the template a warm pool keeps made ahead (Manager.WarmPools); 0: none.
	Pool int
	// HostState overrides Config.HostState for the template's runs: auto or none ("" keeps the Config's).
	HostState string
	// Services are host services by the operator's names (Config.HostServices) offered inside the template's
	// runs' sandboxes, each behind the run's bearer token.
	Services []string
	// Requests is what each of the template's sandboxes reserves on its node, apart from what it may use (CPUs,
	// MemoryBytes, or the Config's): the density of idle sandboxes. Zero fields reserve the limit.
	Requests Requests
	// SuspendAfter is how long one of the template's sandboxes stays idle before the sweeper suspends it: its
	// container or pod removed, its workspace kept; the next command resumes it (lifecycle/suspend.go). 0: never.
	SuspendAfter time.Duration
	// PauseOnRetention: when one of the template's sandboxes' time runs out (stopped past Retention), the sweeper
	// suspends it (its workspace kept whatever RemoveWorkspaceOnRetention says; the next command resumes it)
	// rather than removing it.
	PauseOnRetention bool
}

// Requests is what a sandbox reserves: CPUs (cores, e.g. 0.05) and MemoryBytes, each at most its limit.
type Requests struct {
	CPUs        float64
	MemoryBytes int64
}

// TemplateSecret is one secret file of a template: the operator's secret Name at Path (under /run/secrets).
type TemplateSecret struct {
	Name string
	Path string
	Mode string // octal, default "0400"
}

// template is a Template the Manager resolved, with its name.
type template struct {
	Template
	nm string
}

// checkTemplates refuses a Config whose templates or defaults do not add up.
func (m *Manager) checkTemplates() error {
	for name, t := range m.cfg.Templates {
		if !lifecycle.ValidTemplateName(name) {
			return fault.New(fault.InvalidArgument, "name templates with letters, digits, '-', '_' and '.'",
				"template name %q is not valid", name)
		}
		if t.Pool < 0 || m.cfg.PoolCap < 0 {
			return fault.New(fault.InvalidArgument, "set pool (and pool_cap) to 0 or more",
				"template %q: pool %d, pool cap %d", name, t.Pool, m.cfg.PoolCap)
		}
		if err := m.checkRequests(name, t); err != nil {
			return err
		}
		if err := m.checkServices(name, t); err != nil {
			return err
		}
		if t.SuspendAfter < 0 {
			return fault.New(fault.InvalidArgument, "set suspend_after to a duration such as 10m, or leave it out",
				"template %q: suspend_after %s is negative", name, t.SuspendAfter)
		}
		if len(t.Env) > 0 {
			if err := guard.Env(t.Env); err != nil {
				return err
			}
		}
	}
	if d := m.cfg.DefaultTemplate; d != "" {
		if _, ok := m.cfg.Templates[d]; !ok {
			return fault.New(fault.InvalidArgument, "define it under templates, or change default_template",
				"the default template %q is not defined", d)
		}
	}
	for tenant, name := range m.cfg.TenantTemplates {
		t, ok := m.cfg.Templates[name]
		if !ok || !t.allows(tenant) {
			return fault.New(fault.InvalidArgument, "define the template and let the tenant use it",
				"tenant %q defaults to template %q, which is not defined for it", tenant, name)
		}
	}
	return nil
}

// checkRequests refuses a template that reserves less than nothing or more than it may use: a request above its
// limit would be refused by Kubernetes at the first pod, long after the operator started the server.
func (m *Manager) checkRequests(name string, t Template) error {
	cpus, mem := t.CPUs, t.MemoryBytes
	if cpus <= 0 {
		cpus = m.cfg.CPUs
	}
	if cpus <= 0 {
		cpus = float64(lifecycle.DefaultNanoCPUs) / 1e9
	}
	if mem <= 0 {
		mem = m.cfg.MemoryBytes
	}
	if mem <= 0 {
		mem = lifecycle.DefaultMemory
	}
	r := t.Requests
	if r.CPUs < 0 || r.MemoryBytes < 0 || r.CPUs > cpus || r.MemoryBytes > mem {
		return fault.New(fault.InvalidArgument, "set requests between 0 and the template's cpus and memory (its limits)",
			"template %q: requests (cpus %g, memory %d bytes) exceed its limits (cpus %g, memory %d bytes) or are negative",
			name, r.CPUs, r.MemoryBytes, cpus, mem)
	}
	return nil
}

// Templates lists the templates tenant may use, sorted by name.
func (m *Manager) Templates(tenant string) []string {
	var out []string
	for name, t := range m.cfg.Templates {
		if t.allows(tenant) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// template resolves the template a run of tenant asks for: name, else the tenant's default, else the Config's;
// nil when none applies. A template tenant may not use answers exactly like a missing one.
func (m *Manager) template(tenant, name string) (*template, error) {
	if name == "" {
		name = m.cfg.TenantTemplates[tenant]
	}
	if name == "" {
		name = m.cfg.DefaultTemplate
	}
	if name == "" {
		return nil, nil
	}
	t, ok := m.cfg.Templates[name]
	if !ok || !t.allows(tenant) {
		return nil, fault.New(fault.TemplateNotFound, "list the templates your token may use (GET /v1/templates)",
			"no template %q", name)
	}
	return &template{Template: t, nm: name}, nil
}

func (t Template) allows(tenant string) bool {
	return len(t.Tenants) == 0 || slices.Contains(t.Tenants, tenant)
}

func (t *template) name() string {
	if t == nil {
		return ""
	}
	return t.nm
}

// apply puts the template's fields into a shape's Config.
func (t *template) apply(c *lifecycle.Config) {
	if t == nil {
		return
	}
	if t.Image != "" {
		c.Image = t.Image
	}
	if t.User != "" {
		c.User = t.User
	}
	if t.CPUs > 0 {
		c.NanoCPUs = int64(t.CPUs * 1e9)
	}
	if t.MemoryBytes > 0 {
		c.MemoryBytes = t.MemoryBytes
	}
	if t.PidsLimit > 0 {
		c.PidsLimit = t.PidsLimit
	}
	c.RequestNanoCPUs, c.RequestMemoryBytes = int64(t.Requests.CPUs*1e9), t.Requests.MemoryBytes
	c.Env = append(c.Env, t.Env...)
	if t.PostCreate != "" {
		c.PostCreate = t.PostCreate
	}
}

func (t *template) network() *Network {
	if t == nil {
		return nil
	}
	return t.Network
}

func (t *template) secretFiles() []spec.SecretFile {
	if t == nil {
		return nil
	}
	out := make([]spec.SecretFile, 0, len(t.Secrets))
	for _, s := range t.Secrets {
		out = append(out, spec.SecretFile{Name: s.Name, Path: s.Path, Mode: s.Mode})
	}
	return out
}

// shaped reports whether the repository changes the sandbox itself (and so needs a shape of its own).
func (r *repository) shaped() bool {
	sb := r.sb
	return sb.Image != "" || len(sb.Env) > 0 || len(sb.Mounts) > 0 || len(sb.Tmpfs) > 0 || sb.PostCreate != "" ||
		sb.Resources != nil
}

// mergeNetwork adds the repository's network block to base, with the operator's values for the credentials it
// names.
func (r *repository) mergeNetwork(base *Network, op RepositoryPolicy) (*Network, error) {
	n := r.sb.Network
	if n == nil {
		return base, nil
	}
	nw := &Network{Mode: n.Mode, Preset: n.Preset, Rules: n.Rules, Inherit: n.Inherit, Inspect: n.Inspect}
	creds, err := op.ResolveCredentials(n.Credentials)
	if err != nil {
		return nil, err
	}
	for _, c := range creds {
		nw.Credentials = append(nw.Credentials, CredentialOf(c))
	}
	return lifecycle.MergeNetwork(base, nw)
}

// CredentialOf is the operator's resolved credential as the library's network block carries it (the repository's
// references, and the CLI's templates).
func CredentialOf(c tier.ResolvedCredential) Credential {
	return Credential{Name: c.Name, Value: c.Value, Hosts: c.Hosts, Header: c.Header, Scheme: c.Scheme, Fields: c.Fields,
		AllowPlaintext: c.AllowPlaintext}
}

// secretFiles resolves secret files by the operator's names into the files every command of the run gets.
func (m *Manager) secretFiles(files []spec.SecretFile) ([]Secret, error) {
	if len(files) == 0 {
		return nil, nil
	}
	resolved, err := m.cfg.Repository.ResolveSecrets(files)
	if err != nil {
		return nil, err
	}
	out := make([]Secret, 0, len(resolved))
	for _, s := range resolved {
		out = append(out, Secret{Name: s.Name, Path: s.Path, Mode: s.Mode, Value: s.Value})
	}
	return out, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
