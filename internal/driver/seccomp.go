package driver

import (
	"bytes"
	_ "embed"
	"encoding/json"
)

// seccompJSON is sandkeep's seccomp profile: Docker's default (moby/profiles/seccomp v0.3.0, the list of Docker
// 25+, which no longer allows io_uring) with the rules that depend on capabilities removed (a sandbox has none)
// and the calls docs/SECURITY.md lists denied. It is a file in the repository, so a review sees every change.
//
//go:embed seccomp.json
var seccompJSON []byte

// seccompProfile is seccompJSON compacted: the exact string a driver hands the engine and the posture hashes.
var seccompProfile = func() string {
	var b bytes.Buffer
	if err := json.Compact(&b, seccompJSON); err != nil {
		panic("seccomp.json is not JSON: " + err.Error())
	}
	return b.String()
}()

// SeccompProfile returns sandkeep's seccomp profile as compact JSON, in the format of the Docker Engine API's
// `seccomp=<profile>` security option (the OCI-like "defaultAction/syscalls" form).
func SeccompProfile() string { return seccompProfile }

// DeniedSyscall is one call the profile refuses (EPERM) although Docker's default profile, or a capability a
// sandbox never has, might let it through; Why is the threat it closes. docs/SECURITY.md prints this list.
type DeniedSyscall struct {
	Names []string
	Why   string
}

// DeniedSyscalls are the calls sandkeep's profile refuses on purpose. Tests check that none of them is allowed
// by an unconditional rule of the profile and that a sandbox gets EPERM for them.
var DeniedSyscalls = []DeniedSyscall{
	{[]string{"io_uring_setup", "io_uring_enter", "io_uring_register"},
		"io_uring bypasses seccomp for the operations it queues and has been the way out of containers several times; Docker 20.10's default allows it"},
	{[]string{"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise"},
		"reading or steering another process: a command must not reach the agent (PID 1, serve) that runs as the same uid"},
	{[]string{"userfaultfd"}, "stalls kernel copies at will: the usual helper for winning kernel races"},
	{[]string{"keyctl", "add_key", "request_key"}, "the kernel keyring is not namespaced: keys would be shared with the host user of the same uid"},
	{[]string{"bpf"}, "eBPF programs are a large kernel attack surface and can read kernel memory"},
	{[]string{"perf_event_open"}, "performance counters leak kernel addresses and other processes' activity"},
	{[]string{"kexec_load", "kexec_file_load", "reboot"}, "replacing or rebooting the kernel"},
	{[]string{"open_by_handle_at"}, "opens host files by handle around the mount namespace (the \"shocker\" escape)"},
	{[]string{"unshare", "setns"},
		"a new user namespace gives a command every capability inside it, and with them the kernel surface they guard (unshare without CLONE_NEW* flags is allowed)"},
	{[]string{"clone"}, "the same with CLONE_NEW* flags; clone for fork and threads is allowed"},
	{[]string{"clone3"}, "its flags are in memory seccomp cannot read: it fails with ENOSYS, and libcs fall back to clone"},
	{[]string{"mount", "umount2", "pivot_root", "chroot", "fsopen", "fsmount", "fsconfig", "fspick", "move_mount", "open_tree", "mount_setattr"},
		"changing what the file system shows: the binds (workspace, agent, channel) must stay as the host made them"},
	{[]string{"init_module", "finit_module", "delete_module", "iopl", "ioperm"}, "kernel modules and raw I/O ports"},
	{[]string{"swapon", "swapoff", "syslog", "acct", "quotactl", "lookup_dcookie", "fanotify_init", "vhangup",
		"settimeofday", "clock_settime", "clock_settime64", "stime"},
		"host-wide state: swap, the kernel log, accounting, quotas, file-system-wide notification, the terminal, the clock"},
}
