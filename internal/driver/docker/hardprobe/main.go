//go:build linux

// Command hardprobe is a static test binary (CGO_ENABLED=0) the Docker hardening tests run inside a sandbox, as a
// hostile command would: it makes the calls sandkeep's seccomp profile denies and the ordinary ones it must
// allow, and prints what each returned, one "name errno" line per call (0: success).
//
//	hardprobe syscalls   the denied and the allowed calls
//	hardprobe status     CapEff, NoNewPrivs and Seccomp of /proc/self/status, and RLIMIT_CORE / RLIMIT_NOFILE
//	hardprobe crash      aborts with a core dump requested (GOTRACEBACK=crash)
//	hardprobe pid1       tries to take over PID 1: ptrace attach, /proc/1/mem and /proc/1/environ, SIGTERM,
//	                     dialling the channel socket
package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: hardprobe syscalls|status|crash|pid1 [socket]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "syscalls":
		syscalls()
	case "status":
		status()
	case "crash":
		debug.SetTraceback("crash")
		var p *int
		fmt.Println(*p) // SIGSEGV; with "crash" the runtime re-raises it to dump core
	case "pid1":
		sock := ""
		if len(os.Args) > 2 {
			sock = os.Args[2]
		}
		pid1(sock)
	default:
		os.Exit(2)
	}
}

func report(name string, err error) {
	var errno syscall.Errno
	switch {
	case err == nil:
		fmt.Printf("%s 0\n", name)
	case errors.As(err, &errno):
		fmt.Printf("%s %d\n", name, int(errno))
	default:
		fmt.Printf("%s -1 %v\n", name, err)
	}
}

// raw makes a system call with invalid or harmless arguments: an allowed call fails with EINVAL, EFAULT or
// EBADF (or works); only seccomp answers EPERM to all of them.
func raw(name string, trap uintptr, a ...uintptr) {
	var args [6]uintptr
	copy(args[:], a)
	_, _, e := unix.Syscall6(trap, args[0], args[1], args[2], args[3], args[4], args[5])
	if e != 0 {
		report(name, e)
		return
	}
	report(name, nil)
}

func syscalls() {
	var params [120]byte
	raw("io_uring_setup", unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])))
	raw("io_uring_enter", unix.SYS_IO_URING_ENTER, ^uintptr(0), 0, 0, 0, 0, 0)
	raw("io_uring_register", unix.SYS_IO_URING_REGISTER, ^uintptr(0), 0, 0, 0)
	raw("ptrace", unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1)
	raw("process_vm_readv", unix.SYS_PROCESS_VM_READV, 1, 0, 0, 0, 0, 0)
	raw("process_vm_writev", unix.SYS_PROCESS_VM_WRITEV, 1, 0, 0, 0, 0, 0)
	raw("userfaultfd", unix.SYS_USERFAULTFD, 0)
	raw("keyctl", unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, ^uintptr(0)-2, 0) // KEY_SPEC_SESSION_KEYRING
	raw("add_key", unix.SYS_ADD_KEY, 0, 0, 0, 0, 0)
	raw("request_key", unix.SYS_REQUEST_KEY, 0, 0, 0, 0)
	raw("bpf", unix.SYS_BPF, unix.BPF_PROG_LOAD, 0, 0)
	raw("perf_event_open", unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0)
	raw("kexec_load", unix.SYS_KEXEC_LOAD, 0, 0, 0, 0)
	raw("kexec_file_load", unix.SYS_KEXEC_FILE_LOAD, ^uintptr(0), ^uintptr(0), 0, 0, 0)
	raw("open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(0), 0, 0)
	raw("setns", unix.SYS_SETNS, ^uintptr(0), 0)
	raw("unshare_newuser", unix.SYS_UNSHARE, unix.CLONE_NEWUSER)
	raw("unshare_newns", unix.SYS_UNSHARE, unix.CLONE_NEWNS)
	raw("unshare_newnet", unix.SYS_UNSHARE, unix.CLONE_NEWNET)
	raw("clone3", unix.SYS_CLONE3, 0, 0)
	raw("mount", unix.SYS_MOUNT, 0, 0, 0, 0, 0)
	raw("umount2", unix.SYS_UMOUNT2, 0, 0)
	raw("pivot_root", unix.SYS_PIVOT_ROOT, 0, 0)
	raw("kcmp", unix.SYS_KCMP, 1, 1, 0, 0, 0)
	raw("pidfd_getfd", unix.SYS_PIDFD_GETFD, ^uintptr(0), 0, 0)
	raw("fsopen", unix.SYS_FSOPEN, 0, 0)
	raw("open_tree", unix.SYS_OPEN_TREE, ^uintptr(0), 0, 0)

	// A user namespace through clone(2): fork with CLONE_NEWUSER.
	_, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{
		Sys: &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER},
	})
	report("clone_newuser", err)

	// What ordinary work needs.
	report("fork_exec", exec.Command("/bin/sh", "-c", "exit 0").Run())
	report("pipe", pipe())
	report("loopback_tcp", loopback("tcp", "127.0.0.1:0"))
	report("unix_socket", loopback("unix", fmt.Sprintf("/tmp/hardprobe-%d.sock", os.Getpid())))
	raw("unshare_files", unix.SYS_UNSHARE, unix.CLONE_FILES)
}

func pipe() error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	if _, err := w.Write([]byte("x")); err != nil {
		return err
	}
	w.Close()
	b := make([]byte, 2)
	n, err := r.Read(b)
	if err != nil || n != 1 {
		return fmt.Errorf("pipe read %d: %v", n, err)
	}
	return nil
}

func loopback(network, addr string) error {
	ln, err := net.Listen(network, addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, err = c.Write([]byte("ok"))
			c.Close()
		}
		done <- err
	}()
	c, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	b := make([]byte, 2)
	if _, err := c.Read(b); err != nil || string(b) != "ok" {
		return fmt.Errorf("read %q: %v", b, err)
	}
	return <-done
}

func status() {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		fmt.Println("status-error", err)
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		switch k {
		case "CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp":
			fmt.Printf("%s %s\n", k, strings.TrimSpace(v))
		}
	}
	for _, r := range []struct {
		name string
		res  int
	}{{"RLIMIT_CORE", unix.RLIMIT_CORE}, {"RLIMIT_NOFILE", unix.RLIMIT_NOFILE}} {
		var lim unix.Rlimit
		if err := unix.Getrlimit(r.res, &lim); err != nil {
			fmt.Println(r.name, "error", err)
			continue
		}
		fmt.Printf("%s %d %d\n", r.name, lim.Cur, lim.Max)
	}
}

// pid1 is what a command would try against the agent's PID 1; each line is "what errno" (0: it worked).
func pid1(sock string) {
	raw("ptrace_attach_1", unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1)
	raw("ptrace_seize_1", unix.SYS_PTRACE, unix.PTRACE_SEIZE, 1)
	for _, p := range []string{"/proc/1/mem", "/proc/1/environ"} {
		f, err := os.Open(p)
		if err == nil {
			f.Close()
		}
		report("open_"+strings.ReplaceAll(strings.TrimPrefix(p, "/proc/1/"), "/", "_"), err)
	}
	_, err := os.ReadDir("/proc/1/fd")
	report("readdir_fd", err)
	report("kill_term_1", syscall.Kill(1, syscall.SIGTERM))
	report("kill_int_1", syscall.Kill(1, syscall.SIGINT))
	report("kill_hup_1", syscall.Kill(1, syscall.SIGHUP))
	if sock != "" {
		// The dial itself may connect (the socket is 0666); the host must close it at once, unverified.
		c, err := net.Dial("unix", sock)
		if err != nil {
			report("dial_channel", err)
			return
		}
		defer c.Close()
		b := make([]byte, 1)
		_, err = c.Read(b)
		if err == nil {
			report("dial_channel_read", nil) // the host talked to us: a takeover
			return
		}
		fmt.Println("dial_channel_read closed")
	}
}
