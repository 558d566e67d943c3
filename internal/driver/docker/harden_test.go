package docker_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/api/types/build"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/channel"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// probePath is where hardImage puts hardprobe (./hardprobe) in the image.
const probePath = "/bin/hardprobe"

// hardImage is the test image with hardprobe, a static binary that tries what a hostile command would.
func hardImage(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(testutil.BuildBinary(t, "./internal/driver/docker/hardprobe", "hardprobe", false))
	if err != nil {
		t.Fatal(err)
	}
	return testutil.ImageWithFiles(t, testutil.TestImage(t), map[string]testutil.ImageFile{probePath: {Data: data, Mode: 0o755}})
}

// EnvTestRuntime names the OCI runtime the Docker tests run sandboxes under ("" the engine's default; CI runs the
// driver suites once more with runsc, scripts/test.sh).
const EnvTestRuntime = "SANDKEEP_TEST_RUNTIME"

func testRuntime() string { return os.Getenv(EnvTestRuntime) }

// testTransport is the agent channel, forced, except under gVisor, which has none (the engine's exec).
func testTransport() lifecycle.Transport {
	if testRuntime() == lifecycle.RuntimeGVisor {
		return lifecycle.TransportExec
	}
	return lifecycle.TransportAgent
}

// harness is a real lifecycle Manager over the real Docker driver, in a state home of its own.
type harness struct {
	m    *lifecycle.Manager
	home *lifecycle.Home
}

func newHarness(t *testing.T, image string, edit func(*lifecycle.Config)) *harness {
	t.Helper()
	testutil.Docker(t)
	home, err := lifecycle.OpenHome(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Cleanup(t, home.Installation)
	drvr, err := docker.New(docker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := lifecycle.Config{Image: image, AgentPath: testutil.AgentBinary(t), Transport: testTransport(),
		Runtime: testRuntime()}
	if edit != nil {
		edit(&cfg)
	}
	m, err := lifecycle.New(home, drvr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return &harness{m: m, home: home}
}

type ran struct {
	code           int
	stdout, stderr string
	res            *lifecycle.ExecResult
}

func (h *harness) run(t *testing.T, key identity.Key, argv ...string) ran {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	res, err := h.m.Exec(ctx, key, lifecycle.ExecRequest{Argv: argv, Timeout: time.Minute, Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	return ran{code: res.ExitCode, stdout: stdout.String(), stderr: stderr.String(), res: res}
}

func newKey(t *testing.T, user string) identity.Key {
	t.Helper()
	k, err := identity.New("harden", user+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// lines parses hardprobe's "name value..." output.
func lines(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(l, " ")
		m[k] = v
	}
	return m
}

// TestSeccompProfile: inside a sandbox, every call the profile denies fails with EPERM, and what ordinary work
// needs (fork, exec, pipes, sockets on loopback) works.
func TestSeccompProfile(t *testing.T) {
	h := newHarness(t, hardImage(t), nil)
	key := newKey(t, "seccomp")
	r := h.run(t, key, probePath, "syscalls")
	if r.code != 0 {
		t.Fatalf("hardprobe syscalls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	got := lines(r.stdout)
	const eperm, enosys = "1", "38"
	want := map[string]string{
		"io_uring_setup": eperm, "io_uring_enter": eperm, "io_uring_register": eperm,
		"ptrace": eperm, "process_vm_readv": eperm, "process_vm_writev": eperm,
		"userfaultfd": eperm, "keyctl": eperm, "add_key": eperm, "request_key": eperm,
		"bpf": eperm, "perf_event_open": eperm, "kexec_load": eperm, "kexec_file_load": eperm,
		"open_by_handle_at": eperm, "setns": eperm, "unshare_newuser": eperm, "unshare_newns": eperm,
		"unshare_newnet": eperm, "clone_newuser": eperm, "mount": eperm, "umount2": eperm, "pivot_root": eperm,
		"kcmp": eperm, "pidfd_getfd": eperm, "fsopen": eperm, "open_tree": eperm,
		"clone3":    enosys,
		"fork_exec": "0", "pipe": "0", "loopback_tcp": "0", "unix_socket": "0", "unshare_files": "0",
	}
	if testRuntime() == lifecycle.RuntimeGVisor {
		// Under gVisor the command (an exec'd process) is not under the OCI profile and its calls go to the
		// Sentry, gVisor's user-space kernel, never to the host's: every denied call still fails, except those
		// the Sentry implements itself, which are exactly these (docs/SECURITY.md, "gVisor").
		sentry := map[string]bool{"io_uring_setup": true, "unshare_newns": true, "clone_newuser": true}
		for name, w := range want {
			g, ok := got[name]
			switch {
			case !ok:
				t.Errorf("%s: no answer", name)
			case w == "0" && g != "0":
				t.Errorf("%s: errno %s under gVisor, want success", name, g)
			case w != "0" && sentry[name] != (g == "0"):
				t.Errorf("%s: errno %s under gVisor, want %s", name, g, map[bool]string{true: "success (the Sentry's own)", false: "a failure"}[sentry[name]])
			}
		}
		if t.Failed() {
			t.Logf("hardprobe output:\n%s%s", r.stdout, r.stderr)
		}
		return
	}
	for name, w := range want {
		if g, ok := got[name]; !ok || g != w {
			t.Errorf("%s: errno %q, want %s", name, g, w)
		}
	}
	if t.Failed() {
		t.Logf("hardprobe output:\n%s%s", r.stdout, r.stderr)
	}
}

// TestProcessStatus: a command has no capability, no way to gain privileges, a seccomp filter, no core dumps
// and a bounded file table.
func TestProcessStatus(t *testing.T) {
	h := newHarness(t, hardImage(t), nil)
	r := h.run(t, newKey(t, "status"), probePath, "status")
	got := lines(r.stdout)
	want := map[string]string{
		"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2",
		"RLIMIT_CORE":   "0 0",
		"RLIMIT_NOFILE": strconv.Itoa(lifecycle.DefaultNofile) + " " + strconv.Itoa(lifecycle.DefaultNofile),
	}
	if testRuntime() == lifecycle.RuntimeGVisor {
		// An exec'd process under gVisor has no seccomp filter (Seccomp 0) and gVisor's /proc/self/status has no
		// NoNewPrivs line; capabilities and limits hold (docs/SECURITY.md, "gVisor").
		want["Seccomp"], want["NoNewPrivs"] = "0", ""
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %q, want %q", k, got[k], w)
		}
	}
	if t.Failed() {
		t.Logf("hardprobe status:\n%s%s", r.stdout, r.stderr)
	}
}

// TestNoCoreFile: a command that crashes asking for a core dump leaves no core file in the workspace (its cwd),
// which is the host's directory.
func TestNoCoreFile(t *testing.T) {
	h := newHarness(t, hardImage(t), nil)
	key := newKey(t, "core")
	r := h.run(t, key, probePath, "crash")
	if r.code == 0 {
		t.Fatalf("the crash exited 0:\n%s", r.stderr)
	}
	ws := h.home.Workspace(key)
	entries, err := os.ReadDir(ws)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "core") {
			fi, _ := e.Info()
			t.Errorf("core file %s (%d bytes) written into the workspace", e.Name(), fi.Size())
		}
	}
	if r := h.run(t, key, "sh", "-c", "ls -a /workspace | grep -c core; true"); strings.TrimSpace(r.stdout) != "0" {
		t.Errorf("the sandbox sees core files: %q", r.stdout)
	}
}

// TestAgentOutOfReach: a command that tries to take over PID 1 (ptrace attach, reading its memory and
// environment, signals, dialling the channel socket) gets nowhere, and the key's next command runs normally over
// the same channel with its exact result.
func TestAgentOutOfReach(t *testing.T) {
	h := newHarness(t, hardImage(t), nil)
	key := newKey(t, "pid1")
	first := h.run(t, key, "sh", "-c", "echo warm")
	if first.stdout != "warm\n" || first.res.Transport != testTransport() {
		t.Fatalf("first command: %+v", first)
	}
	r := h.run(t, key, probePath, "pid1", channel.SocketPath)
	got := lines(r.stdout)
	const eperm, eacces = "1", "13"
	want := map[string]string{
		"ptrace_attach_1": eperm, "ptrace_seize_1": eperm,
		"open_mem": eacces, "open_environ": eacces, "readdir_fd": eacces,
		"dial_channel_read": "closed",
	}
	if testRuntime() == lifecycle.RuntimeGVisor {
		delete(want, "dial_channel_read")
		want["dial_channel"] = "2" // no channel under gVisor: nothing to dial
		// gVisor's /proc does not close a non-dumpable process's environ and fd to its own uid (ptrace and
		// /proc/1/mem stay closed): PID 1's environment is the container's, which holds no secret
		// (docs/SECURITY.md, "gVisor").
		want["open_environ"], want["readdir_fd"] = "0", "0"
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %q, want %q", k, got[k], w)
		}
	}
	if t.Failed() {
		t.Logf("hardprobe pid1 (exit %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The signals "worked" (kill(2) returned 0) but changed nothing: PID 1 is the same process, and the next
	// command is exact.
	time.Sleep(200 * time.Millisecond)
	next := h.run(t, key, "sh", "-c", "echo next; echo err >&2; exit 7")
	if next.code != 7 || next.stdout != "next\n" || next.stderr != "err\n" || next.res.Transport != first.res.Transport {
		t.Fatalf("next command: code %d stdout %q stderr %q transport %s", next.code, next.stdout, next.stderr, next.res.Transport)
	}
	if next.res.Sandbox.ID != first.res.Sandbox.ID || next.res.Sandbox.Pid != first.res.Sandbox.Pid {
		t.Fatalf("the sandbox changed: %s/%d -> %s/%d", first.res.Sandbox.ID, first.res.Sandbox.Pid,
			next.res.Sandbox.ID, next.res.Sandbox.Pid)
	}
}

// TestTmpWritableWhateverTheImage: with an image whose /tmp is 0755 root, /tmp and HOME are writable by the
// sandbox user and what is written there persists between commands.
func TestTmpWritableWhateverTheImage(t *testing.T) {
	image := testutil.ImageWithFiles(t, testutil.TestImage(t), map[string]testutil.ImageFile{"/tmp/.keep": {Data: []byte("x")}})
	image = chmodImage(t, image)
	h := newHarness(t, image, nil)
	key := newKey(t, "tmp")
	if r := h.run(t, key, "sh", "-c", "echo kept > /tmp/a && echo home > $HOME/b && stat -c %a /tmp"); r.code != 0 {
		t.Fatalf("write /tmp and HOME: exit %d %s%s", r.code, r.stdout, r.stderr)
	} else if mode := strings.TrimSpace(r.stdout); mode != "1777" {
		t.Errorf("/tmp mode %s, want 1777", mode)
	}
	r := h.run(t, key, "sh", "-c", "cat /tmp/a $HOME/b")
	if r.code != 0 || r.stdout != "kept\nhome\n" {
		t.Fatalf("second command: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// chmodImage builds FROM base an image whose /tmp is 0755 and owned by root, as some images ship it. The RUN
// step runs the base's busybox; nothing is pulled.
func chmodImage(t *testing.T, base string) string {
	t.Helper()
	tag := "sandkeep-test-tmp0755:" + strings.NewReplacer(":", "-", "/", "-").Replace(base)
	if len(tag) > 120 {
		tag = tag[:120]
	}
	buildFromDockerfile(t, tag, "FROM "+base+"\nRUN chmod 0755 /tmp && chown 0:0 /tmp\n")
	return tag
}

// buildFromDockerfile builds dockerfile (a context of that file alone) as tag with the classic builder.
func buildFromDockerfile(t *testing.T, tag, dockerfile string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "Dockerfile", Mode: 0o644, Size: int64(len(dockerfile))}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte(dockerfile))
	tw.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	res, err := testutil.Docker(t).ImageBuild(ctx, &buf, client.ImageBuildOptions{
		Tags: []string{tag}, Dockerfile: "Dockerfile", Remove: true, ForceRemove: true, Version: build.BuilderV1,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	if bytes.Contains(out, []byte(`"errorDetail"`)) {
		t.Fatalf("build %s:\n%s", tag, out)
	}
}

// TestDistinctHostUIDs: with an operator uid range, two keys' sandboxes run under different host uids of the
// range, each owning its own workspace, and each gets EACCES on the other's workspace even when it is bound in
// (an operator mount standing for a leaked one).
func TestDistinctHostUIDs(t *testing.T) {
	testutil.Docker(t)
	base := t.TempDir()
	home, err := lifecycle.OpenHome(base)
	if err != nil {
		t.Fatal(err)
	}
	a, b := newKey(t, "uid-a"), newKey(t, "uid-b")
	leaked, err := home.EnsureWorkspace(a, 0, 0) // exists before the mount is checked; handed to A's uid later
	if err != nil {
		t.Fatal(err)
	}
	testutil.Cleanup(t, home.Installation)
	drvr, err := docker.New(docker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := lifecycle.UIDRange{First: 231000, Count: 1000}
	m, err := lifecycle.New(home, drvr, lifecycle.Config{
		Image: testutil.TestImage(t), AgentPath: testutil.AgentBinary(t), Transport: testTransport(),
		UIDs: r, Mounts: []driver.Mount{{Source: leaked, Target: "/leak"}}, Runtime: testRuntime(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	h := &harness{m: m, home: home}

	ra := h.run(t, a, "sh", "-c", "id -u; id -g; echo secret > /workspace/s && cat /leak/s")
	rb := h.run(t, b, "sh", "-c", "id -u; id -g; echo mine > /workspace/m")
	uidA, uidB := strings.Fields(ra.stdout), strings.Fields(rb.stdout)
	if ra.code != 0 || rb.code != 0 || len(uidA) != 3 || len(uidB) != 2 {
		t.Fatalf("a: %d %q %q; b: %d %q %q", ra.code, ra.stdout, ra.stderr, rb.code, rb.stdout, rb.stderr)
	}
	if uidA[0] == uidB[0] || uidA[0] != uidA[1] || uidB[0] != uidB[1] {
		t.Fatalf("uid:gid of a %v, of b %v: want distinct, gid = uid", uidA[:2], uidB)
	}
	for _, u := range []string{uidA[0], uidB[0]} {
		n, _ := strconv.Atoi(u)
		if n < r.First || n >= r.First+r.Count {
			t.Fatalf("uid %d outside the range %s", n, r)
		}
	}
	for key, want := range map[identity.Key]string{a: uidA[0], b: uidB[0]} {
		fi, err := os.Stat(home.Workspace(key))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if strconv.Itoa(int(st.Uid)) != want || fi.Mode().Perm() != 0o700 {
			t.Errorf("workspace of %s: owner %d mode %v, want %s 0700", key.Short(), st.Uid, fi.Mode().Perm(), want)
		}
	}
	// B sees A's workspace bound at /leak and gets nothing from it.
	for _, cmd := range []string{"ls /leak", "cat /leak/s", "touch /leak/x"} {
		r := h.run(t, b, "sh", "-c", cmd)
		if r.code == 0 || !strings.Contains(r.stderr, "Permission denied") {
			t.Errorf("b: %s: exit %d, stdout %q, stderr %q; want EACCES", cmd, r.code, r.stdout, r.stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(home.Workspace(a), "x")); err == nil {
		t.Error("b created a file in a's workspace")
	}
}

// quotaHarness is a harness whose keys' workspaces have a quota; every workspace file system it mounted is
// unmounted and its image deleted when the test ends, after its containers are gone.
func quotaHarness(t *testing.T, home *lifecycle.Home, image string, keys []identity.Key, edit func(*lifecycle.Config)) *harness {
	t.Helper()
	t.Cleanup(func() {
		for _, k := range keys {
			if err := home.RemoveWorkspace(k); err != nil {
				t.Errorf("remove workspace %s: %v", k.Short(), err)
			}
		}
	})
	testutil.Cleanup(t, home.Installation)
	drvr, err := docker.New(docker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := lifecycle.Config{Image: image, AgentPath: testutil.AgentBinary(t), Transport: testTransport(),
		DiskBytes: 64 << 20, DiskInodes: 2048, Runtime: testRuntime()}
	if edit != nil {
		edit(&cfg)
	}
	m, err := lifecycle.New(home, drvr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return &harness{m: m, home: home}
}

// allocated is how much of the host's disk a file takes (its blocks, not its apparent size).
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// TestWorkspaceQuota: with a 64 MiB, 2048-inode quota, writing 100 MiB fails with ENOSPC inside the sandbox, the
// host loses at most the quota, a neighbour's writes succeed, inode exhaustion is ENOSPC too, ps shows the use,
// the workspace is bound nosuid,nodev, survives recycling (with the quota still on), and rm frees it.
func TestWorkspaceQuota(t *testing.T) {
	testutil.Docker(t)
	home, err := lifecycle.OpenHome(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	full, neighbour := newKey(t, "quota-full"), newKey(t, "quota-neighbour")
	h := quotaHarness(t, home, testutil.TestImage(t), []identity.Key{full, neighbour}, nil)
	const quota = 64 << 20

	r := h.run(t, full, "sh", "-c", "grep ' /workspace ' /proc/self/mountinfo")
	// Under gVisor the sandbox sees its gofer's 9p mount, whose flags say nothing of the host's mount.
	if testRuntime() != lifecycle.RuntimeGVisor && (r.code != 0 || !strings.Contains(r.stdout, "nosuid") || !strings.Contains(r.stdout, "nodev")) {
		t.Errorf("/workspace mount: %q (exit %d), want nosuid,nodev", r.stdout, r.code)
	}
	if opts := hostMountOptions(t, home.Workspace(full)); !strings.Contains(opts, "nosuid") || !strings.Contains(opts, "nodev") {
		t.Errorf("the workspace's file system is mounted %q on the host, want nosuid,nodev", opts)
	}
	before := freeBytes(t, home.Dir)
	r = h.run(t, full, "sh", "-c", "dd if=/dev/zero of=/workspace/big bs=1M count=100 2>&1; echo exit=$?")
	if !strings.Contains(r.stdout, "No space left on device") || strings.Contains(r.stdout, "exit=0") {
		t.Fatalf("writing 100 MiB into a 64 MiB workspace: %q", r.stdout)
	}
	img := filepath.Join(home.Dir, "disks", full.Hex()+".img")
	if got := allocated(t, img); got > quota {
		t.Errorf("the workspace takes %d bytes of the host's disk, more than the quota of %d", got, quota)
	}
	t.Logf("host free space dropped by %d MiB (other processes share the disk); the image takes %d MiB",
		(before-freeBytes(t, home.Dir))>>20, allocated(t, img)>>20)

	if r := h.run(t, neighbour, "sh", "-c", "dd if=/dev/zero of=/workspace/ok bs=1M count=10 2>&1 && ls -l /workspace/ok"); r.code != 0 {
		t.Errorf("the neighbour's 10 MiB write failed: %q", r.stdout)
	}

	// ps shows the use.
	info, err := h.m.Info(t.Context(), full)
	if err != nil {
		t.Fatal(err)
	}
	if info.Disk == nil || info.Disk.Bytes < 50<<20 || info.Disk.BytesLimit > quota || info.Disk.InodesLimit < 2048 {
		t.Errorf("Info.Disk = %+v, want about 64 MiB of 64 MiB used", info.Disk)
	}

	// Inodes run out the same way, on the neighbour (its blocks are mostly free).
	r = h.run(t, neighbour, "sh", "-c", "mkdir /workspace/many && cd /workspace/many && i=0; while [ $i -lt 4000 ]; do true > f$i || break; i=$((i+1)); done; echo made=$i")
	_, made, _ := strings.Cut(strings.TrimSpace(r.stdout), "made=")
	if n, _ := strconv.Atoi(made); n < 1500 || n > 2100 || !strings.Contains(r.stderr, "No space left on device") {
		t.Errorf("files made before the inodes ran out: %s, stderr %q; want about 2048 and ENOSPC", made, r.stderr)
	}
	if info, err := h.m.Info(t.Context(), neighbour); err != nil || info.Disk == nil || info.Disk.Inodes < info.Disk.InodesLimit-16 {
		t.Errorf("Info.Disk of the inode-full workspace: %+v, %v", info.Disk, err)
	}

	// rm in the sandbox frees it.
	if r := h.run(t, full, "sh", "-c", "rm /workspace/big && dd if=/dev/zero of=/workspace/again bs=1M count=10 2>&1"); r.code != 0 {
		t.Errorf("after rm, a 10 MiB write failed: %q", r.stdout)
	}

	// Recycling (a posture change: another pids limit) keeps the workspace and its quota.
	h.m.Close()
	h2 := quotaHarness(t, home, testutil.TestImage(t), nil, func(c *lifecycle.Config) { c.PidsLimit = 300 })
	r = h2.run(t, full, "sh", "-c", "ls /workspace; dd if=/dev/zero of=/workspace/big bs=1M count=100 2>&1; echo exit=$?")
	if !strings.Contains(r.stdout, "again") || !strings.Contains(r.stdout, "No space left on device") {
		t.Errorf("after recycling: %q", r.stdout)
	}
	if r.res.Sandbox.ID == info.ID {
		t.Error("the sandbox was not recycled")
	}

	// sandkeep rm removes the workspace: its file system is unmounted and its image deleted.
	if err := h2.m.Remove(t.Context(), full, false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Errorf("image after rm: %v", err)
	}
	if _, err := os.Stat(home.Workspace(full)); !os.IsNotExist(err) {
		t.Errorf("workspace after rm: %v", err)
	}
}

// hostMountOptions returns the per-mount options of the mount at dir in this process's mount table.
func hostMountOptions(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 5 && f[4] == dir {
			return f[5]
		}
	}
	return ""
}

// TestUIDRangeRecycles: per-key uids coming on (an upgrade from a sandkeep that ran every sandbox as 1000, or an
// operator turning "off" back to the default) is a posture change: the key's existing sandbox is recycled, runs
// under its own uid of the default range, and what the old uid wrote in the workspace is its own now.
func TestUIDRangeRecycles(t *testing.T) {
	testutil.Docker(t)
	home, err := lifecycle.OpenHome(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Cleanup(t, home.Installation)
	key := newKey(t, "recycle-uid")
	open := func(r lifecycle.UIDRange) *harness {
		drvr, err := docker.New(docker.Options{})
		if err != nil {
			t.Fatal(err)
		}
		m, err := lifecycle.New(home, drvr, lifecycle.Config{Image: testutil.TestImage(t), AgentPath: testutil.AgentBinary(t),
			Transport: testTransport(), Runtime: testRuntime(), UIDs: r})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return &harness{m: m, home: home}
	}
	first := open(lifecycle.UIDsOff)
	before := first.run(t, key, "sh", "-c", "mkdir -p /workspace/d && echo old > /workspace/d/f && id -u")
	first.m.Close() // one process serves a key's channel at a time
	if strings.TrimSpace(before.stdout) != strconv.Itoa(testutil.SandboxUID) {
		t.Fatalf("before the range: %+v", before)
	}
	after := open(lifecycle.UIDRange{}).run(t, key, "sh", "-c", "id -u; cat /workspace/d/f && echo new >> /workspace/d/f && touch /workspace/d/g")
	f := strings.Fields(after.stdout)
	if after.code != 0 || len(f) != 2 || f[1] != "old" {
		t.Fatalf("after the range: exit %d %q %q", after.code, after.stdout, after.stderr)
	}
	r := lifecycle.DefaultUIDRange
	if uid, _ := strconv.Atoi(f[0]); uid < r.First || uid >= r.First+r.Count {
		t.Fatalf("uid %s outside the default range %s", f[0], r)
	}
	if after.res.Sandbox.ID == before.res.Sandbox.ID {
		t.Fatal("the posture changed but the sandbox was not recycled")
	}
}

// TestVolumeQuota: with a workspace quota, a named volume lives on the workspace's file system, so writing past
// the quota through the volume fails with ENOSPC and the host loses no more than the quota (issue 22, finding 8:
// a devcontainer volume took 150 MB past a 64 MB quota). A volume directory the sandbox swaps for a link out
// is refused when the sandbox is next made, never bound.
func TestVolumeQuota(t *testing.T) {
	testutil.Docker(t)
	home, err := lifecycle.OpenHome(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	key := newKey(t, "quota-volume")
	vol := func(c *lifecycle.Config) { c.Volumes = []lifecycle.Volume{{Name: "data", Target: "/data"}} }
	h := quotaHarness(t, home, testutil.TestImage(t), []identity.Key{key}, vol)
	const quota = 64 << 20

	r := h.run(t, key, "sh", "-c", "dd if=/dev/zero of=/data/big bs=1M count=100 2>&1; echo exit=$?")
	if !strings.Contains(r.stdout, "No space left on device") || strings.Contains(r.stdout, "exit=0") {
		t.Fatalf("writing 100 MiB into a volume of a 64 MiB workspace: %q", r.stdout)
	}
	img := filepath.Join(home.Dir, "disks", key.Hex()+".img")
	if got := allocated(t, img); got > quota {
		t.Errorf("the workspace's image takes %d bytes, more than the quota of %d", got, quota)
	}
	if _, err := os.Stat(filepath.Join(home.Volumes(key), "n-data")); !os.IsNotExist(err) {
		t.Errorf("the volume is outside the quota too (stat: %v)", err)
	}

	// The volumes' directory is root's (the sandbox cannot enter it), but it sits in the sandbox's workspace:
	// the sandbox moves it away and makes its own, with the volume a link to the host's /etc. The next sandbox
	// (recycled by a posture change) is refused rather than bound to it.
	r = h.run(t, key, "sh", "-c", "mv /workspace/.sandkeep-volumes /workspace/moved && mkdir /workspace/.sandkeep-volumes && ln -s /etc /workspace/.sandkeep-volumes/n-data && echo swapped")
	if !strings.Contains(r.stdout, "swapped") {
		t.Fatalf("swap: %q %q", r.stdout, r.stderr)
	}
	h.m.Close()
	h2 := quotaHarness(t, home, testutil.TestImage(t), nil, func(c *lifecycle.Config) { vol(c); c.PidsLimit = 300 })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := h2.m.Exec(ctx, key, lifecycle.ExecRequest{Argv: []string{"cat", "/data/hostname"}, Timeout: time.Minute, Stdout: &out, Stderr: &out})
	if err == nil {
		t.Fatalf("the sandbox was made with its volume linked to the host's /etc (exit %d): %q", res.ExitCode, out.String())
	}
	if !fault.Is(err, fault.Internal) && !fault.Is(err, fault.PostureRefused) {
		t.Errorf("err = %v", err)
	}
}
