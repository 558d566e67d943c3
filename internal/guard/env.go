package guard

import (
	"strings"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// Limits on one environment variable, in bytes. The value limit is Linux's MAX_ARG_STRLEN (128 KiB), above
// which execve fails with E2BIG long after the request was accepted.
const (
	MaxEnvNameLen  = 1024
	MaxEnvValueLen = 128 << 10
)

// envHint is the fix for a refused name.
const envHint = "use a name of letters, digits and underscores (e.g. API_URL), without '=' or control characters"

// EnvVar checks one environment variable. Errors quote the name, cut at any '=', and never the value: it may
// be a secret.
func EnvVar(name, value string) error {
	switch {
	case name == "":
		return fault.New(fault.InvalidEnv, envHint, "environment variable name is empty")
	case len(name) > MaxEnvNameLen:
		return fault.New(fault.InvalidEnv, envHint, "environment variable %s is %d bytes long, over the limit of %d", quoteName(name), len(name), MaxEnvNameLen)
	case strings.Contains(name, "="):
		return fault.New(fault.InvalidEnv, envHint, "environment variable name %s contains '='", quoteName(name))
	}
	if why := badChar(name); why != "" {
		return fault.New(fault.InvalidEnv, envHint, "environment variable name %s %s", quoteName(name), why)
	}
	return envValue(name, value)
}

// envValue checks a value without ever printing it.
func envValue(name, value string) error {
	if len(value) > MaxEnvValueLen {
		return fault.New(fault.InvalidEnv, "pass large data as a file in the workspace instead",
			"environment variable %s has a value of %d bytes, over the limit of %d", quoteName(name), len(value), MaxEnvValueLen)
	}
	if strings.IndexByte(value, 0) >= 0 {
		return fault.New(fault.InvalidEnv, "remove the NUL byte; a process cannot receive it",
			"environment variable %s has a NUL byte in its value", quoteName(name))
	}
	return nil
}

// Env checks a list of "NAME=VALUE" entries with EnvVar. An entry without '=' is refused (Docker would read it
// as "copy from the host", which is not the caller's to ask) and named by its index only: it may be a secret
// pasted on its own.
func Env(env []string) error {
	for i, e := range env {
		name, value, ok := strings.Cut(e, "=")
		if !ok {
			return fault.New(fault.InvalidEnv, "write each entry as NAME=VALUE", "environment entry %d has no '='", i)
		}
		if err := EnvVar(name, value); err != nil {
			return err
		}
	}
	return nil
}
