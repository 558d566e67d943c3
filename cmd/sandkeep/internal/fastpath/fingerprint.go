package fastpath

import (
	"hash/fnv"
	"os"
	"slices"
	"strings"

	"github.com/sandkeep/sandkeep/internal/homedir"
)

// Operator variables the daemon's modes are read from; they are not operator input (see Fingerprint).
const (
	EnvDaemon     = "SANDKEEP_DAEMON"          // auto (default), on, off
	EnvDaemonIdle = "SANDKEEP_DAEMON_IDLE"     // how long an auto-started daemon waits idle before it exits
	EnvFastPath   = "SANDKEEP_DAEMON_FASTPATH" // off: calls through the daemon take the slow path (main's)
	EnvConfig     = "SANDKEEP_CONFIG"          // the server config file, whose content is operator input
)

// Globals are the CLI's global flags that are operator input, as given on the command line ("" when absent).
type Globals struct {
	Home, Image, Agent, Transport, Store string
}

// ResolveHome is the state home that --home (flag), SANDKEEP_HOME or the default names, made absolute.
func ResolveHome(flag string) string {
	home := flag
	if home == "" {
		home = os.Getenv("SANDKEEP_HOME")
	}
	if home == "" {
		home = homedir.Default()
	}
	if abs, err := homedir.Abs(home); err == nil {
		home = abs
	}
	return home
}

// pathEnv are the operator variables that name files: relative values are taken against the working directory.
var pathEnv = map[string]bool{"SANDKEEP_HOME": true, "SANDKEEP_SPEC": true, "SANDKEEP_CONFIG": true, "SANDKEEP_STORE": true,
	"SANDKEEP_AGENT": true, "KUBECONFIG": true}

// Fingerprint digests (digest) everything the in-process path reads from the operator besides the command line of the
// call itself: the operator's variables (SANDKEEP_*, DOCKER_*, KUBERNETES_*, XDG_*, KUBECONFIG, HOME, PATH,
// CONTAINER_HOST; paths made absolute), the global flags and the config file's content. Two processes with the
// same operator input get the same results in-process; the daemon serves only callers whose input is its own.
// The daemon's own three variables (SANDKEEP_DAEMON, _IDLE, _FASTPATH) say how to reach it, not what a command
// does, and are left out.
func Fingerprint(g Globals) string {
	var lines []string
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if k == EnvDaemon || k == EnvDaemonIdle || k == EnvFastPath {
			continue
		}
		if !strings.HasPrefix(k, "SANDKEEP_") && !strings.HasPrefix(k, "DOCKER_") && !strings.HasPrefix(k, "KUBERNETES_") &&
			!strings.HasPrefix(k, "XDG_") && k != "KUBECONFIG" && k != "HOME" && k != "PATH" && k != "CONTAINER_HOST" {
			continue
		}
		if pathEnv[k] && v != "" && !strings.HasPrefix(v, "postgres") {
			if abs, err := homedir.Abs(v); err == nil {
				v = abs
			}
		}
		lines = append(lines, k+"="+v)
	}
	slices.Sort(lines)
	abs := func(p string) string {
		if p == "" || strings.HasPrefix(p, "postgres") {
			return p
		}
		if a, err := homedir.Abs(p); err == nil {
			return a
		}
		return p
	}
	lines = append(lines, "--home="+ResolveHome(g.Home), "--image="+g.Image, "--agent="+abs(g.Agent),
		"--transport="+g.Transport, "--store="+abs(g.Store))
	if p := os.Getenv(EnvConfig); p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			b = []byte("unreadable: " + err.Error())
		}
		lines = append(lines, "config="+digest(b))
	}
	return digest([]byte(strings.Join(lines, "\x00")))
}

// digest is the 128-bit FNV-1a of b in lowercase hex. The fingerprint only tells one operator environment from
// another for an equality test: it is not a security boundary (the socket serves only its owner and root, who
// could run in-process anyway), so a non-cryptographic hash does, and it keeps crypto/sha256 and its FIPS
// packages out of this package's imports (the init would run after theirs; see the package doc).
func digest(b []byte) string {
	h := fnv.New128a()
	_, _ = h.Write(b)
	return hexString(h.Sum(nil))
}

// hexString is encoding/hex's EncodeToString (which imports fmt).
func hexString(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 2*len(b))
	for i, c := range b {
		out[2*i], out[2*i+1] = digits[c>>4], digits[c&0x0f]
	}
	return string(out)
}

// AbsoluteSpec rewrites a relative --spec value in args (the command line of a call) to an absolute path: the
// daemon resolves it in another working directory. value is the flag's parsed value.
func AbsoluteSpec(args []string, value string) []string {
	if value == "" || homedir.IsAbs(value) {
		return args
	}
	abs, err := homedir.Abs(value)
	if err != nil {
		return args
	}
	out := slices.Clone(args)
	for i, a := range out {
		if a == "--" {
			break
		}
		if a == "--spec" && i+1 < len(out) && out[i+1] == value {
			out[i+1] = abs
			break
		}
		if a == "--spec="+value {
			out[i] = "--spec=" + abs
			break
		}
	}
	return out
}
