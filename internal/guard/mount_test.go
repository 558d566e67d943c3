package guard

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// wantFault fails t unless err is an *fault.Error with code whose message contains every one of want and
// whose hint is not empty.
func wantFault(t *testing.T, err error, code fault.Code, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want %s", code)
	}
	fe, ok := err.(*fault.Error)
	if !ok {
		t.Fatalf("got %T %v, want *fault.Error", err, err)
	}
	if fe.Code != code {
		t.Fatalf("code = %s, want %s (%v)", fe.Code, code, err)
	}
	if fe.Hint == "" {
		t.Errorf("error has no hint: %v", err)
	}
	for _, w := range want {
		if !strings.Contains(fe.Message, w) {
			t.Errorf("message %q does not contain %q", fe.Message, w)
		}
	}
}

func TestCheckSource(t *testing.T) {
	tests := []struct {
		name string
		path string
		want string // "" accepts; otherwise a substring of the refusal's message
	}{
		{"project", "/home/alice/project", ""},
		{"project file", "/home/alice/project/main.go", ""},
		{"dotfile not credential", "/home/alice/.bashrc", ""},
		{"config not gcloud", "/home/alice/.config/nvim", ""},
		{"gcloud elsewhere", "/home/alice/gcloud", ""},
		{"var lib other", "/var/lib/postgresql", ""},
		{"run user other", "/run/user/1000/app", ""},
		{"etc other file", "/etc/hosts", ""},
		{"etc shadow like", "/etc/shadowed", ""},
		{"root dir", "/", "host's root directory"},
		{"relative", "home/alice", "not an absolute path"},
		{"empty", "", "not an absolute path"},
		{"dotdot", "/home/alice/../bob", "not clean"},
		{"double slash", "/home//alice", "not clean"},
		{"trailing slash", "/home/alice/", "not clean"},
		{"dot", "/home/./alice", "not clean"},
		{"leading dash", "-v", "starts with '-'"},
		{"nul", "/home/a\x00b", "NUL"},
		{"newline", "/home/a\nb", "control character"},
		{"del", "/home/a\x7fb", "control character"},
		{"c1", "/home/a\u0085b", "control character"},
		{"invalid utf8", "/home/a\xffb", "UTF-8"},
		{"docker sock", "/var/run/docker.sock", "at or under /var/run/docker.sock"},
		{"docker sock run", "/run/docker.sock", "at or under /run/docker.sock"},
		{"containerd dir", "/run/containerd", "/run/containerd"},
		{"containerd sock", "/run/containerd/containerd.sock", "at or under /run/containerd"},
		{"var containerd", "/var/run/containerd/containerd.sock", "/var/run/containerd"},
		{"podman", "/run/podman/podman.sock", "/run/podman"},
		{"var podman", "/var/run/podman", "/var/run/podman"},
		{"crio", "/run/crio/crio.sock", "/run/crio"},
		{"var crio", "/var/run/crio/crio.sock", "/var/run/crio"},
		{"k3s", "/run/k3s/containerd/containerd.sock", "/run/k3s"},
		{"rootless docker", "/run/user/1000/docker.sock", "/run/user/*/docker.sock"},
		{"rootless podman", "/run/user/1000/podman/podman.sock", "/run/user/*/podman"},
		{"docker state", "/run/docker/plugins", "/run/docker"},
		{"docker storage", "/var/lib/docker/overlay2", "/var/lib/docker"},
		{"proc", "/proc", "at or under /proc"},
		{"proc self", "/proc/self/root", "at or under /proc"},
		{"sys", "/sys/fs/cgroup", "at or under /sys"},
		{"dev", "/dev/sda", "at or under /dev"},
		{"root home", "/root", "at or under /root"},
		{"root ssh", "/root/.ssh", "at or under /root"},
		{"boot", "/boot/vmlinuz", "/boot"},
		{"shadow", "/etc/shadow", "/etc/shadow"},
		{"gshadow", "/etc/gshadow", "/etc/gshadow"},
		{"sudoers", "/etc/sudoers", "/etc/sudoers"},
		{"sudoers.d", "/etc/sudoers.d/90-cloud", "/etc/sudoers.d"},
		{"kubernetes", "/etc/kubernetes/admin.conf", "/etc/kubernetes"},
		{"ancestor var", "/var", "contains /var/run/docker.sock"},
		{"ancestor var run", "/var/run", "contains /var/run/docker.sock"},
		{"ancestor run", "/run", "contains /run/docker.sock"},
		{"ancestor etc", "/etc", "contains"},
		{"ancestor run user", "/run/user", "contains /run/user/*/docker.sock"},
		{"ancestor run user uid", "/run/user/1000", "contains /run/user/*/docker.sock"},
		{"ancestor var lib", "/var/lib", "contains /var/lib/docker"},
		{"ssh", "/home/alice/.ssh/id_rsa", "name .ssh"},
		{"ssh dir", "/home/alice/.ssh", "name .ssh"},
		{"aws", "/home/alice/.aws", ".aws"},
		{"gnupg", "/home/alice/.gnupg", ".gnupg"},
		{"kube", "/home/alice/.kube/config", ".kube"},
		{"docker config", "/home/alice/.docker/config.json", ".docker"},
		{"gcloud dot", "/home/alice/.gcloud", ".gcloud"},
		{"azure", "/home/alice/.azure", ".azure"},
		{"npmrc", "/home/alice/.npmrc", ".npmrc"},
		{"pypirc", "/home/alice/.pypirc", ".pypirc"},
		{"netrc", "/home/alice/.netrc", ".netrc"},
		{"config gcloud", "/home/alice/.config/gcloud", ".config/gcloud"},
		{"config gcloud deep", "/home/alice/.config/gcloud/credentials.db", ".config/gcloud"},
		{"config gh", "/home/alice/.config/gh/hosts.yml", ".config/gh"},
		{"ssh in project", "/srv/repo/.ssh/keys", ".ssh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkSource(tt.path)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("checkSource(%q) = %v, want nil", tt.path, err)
				}
				return
			}
			wantFault(t, err, fault.InvalidMount, tt.want, "source")
		})
	}
}

func TestCheckTarget(t *testing.T) {
	tests := []struct {
		name string
		path string
		want string
	}{
		{"under workspace", "/workspace/data", ""},
		{"deep under workspace", "/workspace/a/b/c", ""},
		{"under tmp", "/tmp/cache", ""},
		{"opt", "/opt/data", ""},
		{"home", "/home/sandbox/.cache", ""},
		{"under usr", "/usr/local/share/data", ""},
		{"under etc", "/etc/myapp", ""},
		{"workspace prefix sibling", "/workspaces", ""},
		{"root", "/", "sandbox's root directory"},
		{"relative", "workspace/data", "not an absolute path"},
		{"dotdot", "/workspace/../etc", "not clean"},
		{"trailing", "/workspace/data/", "not clean"},
		{"double slash", "//workspace", "not clean"},
		{"nul", "/workspace/\x00", "NUL"},
		{"leading dash", "-t", "starts with '-'"},
		{"workspace", "/workspace", "/workspace is managed by sandkeep"},
		{"tmp", "/tmp", "/tmp is managed by sandkeep"},
		{"agent dir", "/.sandkeep", "at or under /.sandkeep"},
		{"agent binary", "/.sandkeep/sandkeep-agent", "at or under /.sandkeep"},
		{"proc", "/proc", "at or under /proc"},
		{"under proc", "/proc/sys/kernel", "at or under /proc"},
		{"under sys", "/sys/fs/cgroup", "at or under /sys"},
		{"under dev", "/dev/shm", "at or under /dev"},
		{"bin", "/bin", "system directory /bin"},
		{"sbin", "/sbin", "/sbin"},
		{"usr", "/usr", "/usr"},
		{"lib", "/lib", "/lib"},
		{"lib32", "/lib32", "/lib32"},
		{"lib64", "/lib64", "/lib64"},
		{"libx32", "/libx32", "/libx32"},
		{"etc", "/etc", "/etc"},
		{"boot", "/boot", "/boot"},
		{"var", "/var", "/var"},
		{"run", "/run", "/run"},
		{"root home", "/root", "/root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkTarget(tt.path)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("checkTarget(%q) = %v, want nil", tt.path, err)
				}
				return
			}
			wantFault(t, err, fault.InvalidMount, tt.want, "target")
		})
	}
}

// hostFixture builds a directory tree in t.TempDir for the host-side rules and returns its root.
func hostFixture(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	mustDo(t, os.Mkdir(filepath.Join(dir, "project"), 0o755))
	mustDo(t, os.WriteFile(filepath.Join(dir, "project", "main.go"), []byte("package main\n"), 0o644))
	mustDo(t, os.Symlink(filepath.Join(dir, "project"), filepath.Join(dir, "link-to-project")))
	mustDo(t, os.Symlink("/proc/self", filepath.Join(dir, "link-to-proc")))
	mustDo(t, os.Symlink("/root", filepath.Join(dir, "link-to-root")))
	mustDo(t, os.Symlink("/etc", filepath.Join(dir, "link-to-etc")))
	mustDo(t, os.MkdirAll(filepath.Join(dir, "home", ".ssh"), 0o700))
	mustDo(t, os.MkdirAll(filepath.Join(dir, "gchome", ".config", "gcloud"), 0o700))
	mustDo(t, os.MkdirAll(filepath.Join(dir, "real", ".aws"), 0o700))
	mustDo(t, os.Symlink(filepath.Join(dir, "real", ".aws"), filepath.Join(dir, "innocent")))
	mustDo(t, syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
	return dir
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestCheckMount(t *testing.T) {
	dir := hostFixture(t)
	tests := []struct {
		name   string
		source string // relative to the fixture unless absolute
		target string
		want   string
	}{
		{"project dir", "project", "/workspace/project", ""},
		{"project file", "project/main.go", "/workspace/main.go", ""},
		{"link to project", "link-to-project", "/workspace/p", ""},
		{"missing", "nope", "/workspace/x", "does not exist"},
		{"missing under link", "link-to-project/nope", "/workspace/x", "does not exist"},
		{"link to proc self", "link-to-proc", "/workspace/x", "at or under /proc"},
		{"link to root", "link-to-root", "/workspace/x", "at or under /root"},
		{"through link to etc", "link-to-etc/shadow", "/workspace/x", "at or under /etc/shadow"},
		{"link to etc", "link-to-etc", "/workspace/x", "resolves through a symlink"},
		{"link to credentials", "innocent", "/workspace/x", ".aws"},
		{"home directory", "home", "/workspace/x", "looks like a home directory"},
		{"home with gcloud", "gchome", "/workspace/x", ".config/gcloud"},
		{"fifo", "fifo", "/workspace/x", "named pipe"},
		{"bad target", "project", "/usr", "system directory /usr"},
		{"denied before stat", "/proc/self", "/workspace/x", "at or under /proc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := tt.source
			if !filepath.IsAbs(src) {
				src = filepath.Join(dir, src)
			}
			err := CheckMount(driver.Mount{Source: src, Target: tt.target})
			if tt.want == "" {
				if err != nil {
					t.Fatalf("CheckMount(%q) = %v, want nil", src, err)
				}
				return
			}
			wantFault(t, err, fault.InvalidMount, tt.want)
		})
	}
}

// TestCheckMountDockerSocket covers a symlink to the real socket, when this host has one.
func TestCheckMountDockerSocket(t *testing.T) {
	if _, err := os.Stat("/run/docker.sock"); err != nil {
		t.Skip("no /run/docker.sock on this host; the lexical rule is covered by TestCheckSource")
	}
	link := filepath.Join(t.TempDir(), "sock")
	mustDo(t, os.Symlink("/var/run/docker.sock", link))
	wantFault(t, CheckMount(driver.Mount{Source: link, Target: "/workspace/x"}), fault.InvalidMount, "docker.sock")
}

func TestParseMount(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		in   string // SRC stands for an existing temp directory
		want driver.Mount
		err  string
	}{
		{"full", "type=bind,source=SRC,target=/workspace/a,readonly", driver.Mount{Source: dir, Target: "/workspace/a", ReadOnly: true}, ""},
		{"default type", "source=SRC,target=/workspace/a", driver.Mount{Source: dir, Target: "/workspace/a"}, ""},
		{"src dst", "src=SRC,dst=/workspace/a", driver.Mount{Source: dir, Target: "/workspace/a"}, ""},
		{"destination", "src=SRC,destination=/workspace/a", driver.Mount{Source: dir, Target: "/workspace/a"}, ""},
		{"ro", "src=SRC,dst=/workspace/a,ro", driver.Mount{Source: dir, Target: "/workspace/a", ReadOnly: true}, ""},
		{"readonly true", "src=SRC,dst=/workspace/a,readonly=true", driver.Mount{Source: dir, Target: "/workspace/a", ReadOnly: true}, ""},
		{"readonly 1", "src=SRC,dst=/workspace/a,readonly=1", driver.Mount{Source: dir, Target: "/workspace/a", ReadOnly: true}, ""},
		{"readonly false", "src=SRC,dst=/workspace/a,readonly=false", driver.Mount{Source: dir, Target: "/workspace/a"}, ""},
		{"ro 0", "src=SRC,dst=/workspace/a,ro=0", driver.Mount{Source: dir, Target: "/workspace/a"}, ""},
		{"upper keys", "Type=BIND,Source=SRC,Target=/workspace/a", driver.Mount{Source: dir, Target: "/workspace/a"}, ""},
		{"order free", "readonly,target=/workspace/a,source=SRC", driver.Mount{Source: dir, Target: "/workspace/a", ReadOnly: true}, ""},
		{"empty", "", driver.Mount{}, "mount is empty"},
		{"volume", "type=volume,source=data,target=/workspace/a", driver.Mount{}, "type volume"},
		{"tmpfs", "type=tmpfs,target=/workspace/a", driver.Mount{}, "type tmpfs"},
		{"npipe", "type=npipe,source=SRC,target=/workspace/a", driver.Mount{}, "only bind"},
		{"unknown key", "source=SRC,target=/workspace/a,bind-propagation=shared", driver.Mount{}, `unknown key "bind-propagation"`},
		{"dup source", "source=SRC,src=SRC,target=/workspace/a", driver.Mount{}, "source more than once"},
		{"dup readonly", "source=SRC,target=/workspace/a,ro,readonly", driver.Mount{}, "readonly more than once"},
		{"empty value", "source=,target=/workspace/a", driver.Mount{}, `empty value for "source"`},
		{"empty type", "type=,source=SRC,target=/workspace/a", driver.Mount{}, "empty value"},
		{"empty field", "source=SRC,,target=/workspace/a", driver.Mount{}, "empty field"},
		{"trailing comma", "source=SRC,target=/workspace/a,", driver.Mount{}, "empty field"},
		{"bare source", "source,target=/workspace/a", driver.Mount{}, "without a value"},
		{"readonly yes", "source=SRC,target=/workspace/a,readonly=yes", driver.Mount{}, `readonly="yes"`},
		{"no source", "target=/workspace/a", driver.Mount{}, "has no source"},
		{"no target", "source=SRC", driver.Mount{}, "has no target"},
		{"docker sock", "source=/var/run/docker.sock,target=/var/run/docker.sock", driver.Mount{}, "docker.sock"},
		{"ssh", "source=/home/alice/.ssh,target=/workspace/ssh,readonly", driver.Mount{}, ".ssh"},
		{"target workspace", "source=SRC,target=/workspace", driver.Mount{}, "managed by sandkeep"},
		{"relative source", "source=.,target=/workspace/a", driver.Mount{}, "not an absolute path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMount(strings.ReplaceAll(tt.in, "SRC", dir))
			if tt.err != "" {
				wantFault(t, err, fault.InvalidMount, tt.err)
				return
			}
			if err != nil {
				t.Fatalf("ParseMount(%q) = %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("ParseMount(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestPathMatch(t *testing.T) {
	tests := []struct {
		name, p, pattern    string
		atOrUnder, ancestor bool
	}{
		{"equal", "/a/b", "/a/b", true, false},
		{"under", "/a/b/c", "/a/b", true, false},
		{"ancestor", "/a", "/a/b", false, true},
		{"root ancestor", "/", "/a", false, true},
		{"sibling prefix", "/a/bc", "/a/b", false, false},
		{"wildcard under", "/run/user/1000/podman/x", "/run/user/*/podman", true, false},
		{"wildcard ancestor", "/run/user/1000", "/run/user/*/podman", false, true},
		{"wildcard other", "/run/user/1000/app", "/run/user/*/podman", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := atOrUnder(tt.p, tt.pattern); got != tt.atOrUnder {
				t.Errorf("atOrUnder(%q, %q) = %v", tt.p, tt.pattern, got)
			}
			if got := ancestorOf(tt.p, tt.pattern); got != tt.ancestor {
				t.Errorf("ancestorOf(%q, %q) = %v", tt.p, tt.pattern, got)
			}
		})
	}
}
