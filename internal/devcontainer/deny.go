package devcontainer

import "strings"

// Deny classes, as named in events.
const (
	ClassProxy      = "proxy"      // would route the sandbox's traffic around, or through, someone else's proxy
	ClassLoader     = "loader"     // would inject code into every dynamically linked program
	ClassStartup    = "startup"    // would run code when a shell or an interpreter starts
	ClassCredential = "credential" // looks like a credential; credentials reach a sandbox as secret files only
)

// proxyNames are compared case-insensitively, so http_proxy and HTTP_PROXY are both caught.
var proxyNames = []string{"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "FTP_PROXY"}

// loaderPrefixes: every LD_* variable steers the glibc/musl loader (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...),
// and DYLD_* is its macOS twin.
var loaderPrefixes = []string{"LD_", "DYLD_"}

// startupNames run code in shells and interpreters the agent's commands start.
var startupNames = []string{"BASH_ENV", "ENV", "PROMPT_COMMAND", "PYTHONSTARTUP", "NODE_OPTIONS"}

// credentialSuffixes mark a credential by the end of its name.
var credentialSuffixes = []string{"_TOKEN", "_SECRET", "_PASSWORD", "_KEY"}

// credentialPrefixes mark whole families of credentials: every AWS_* variable is an AWS credential or steers
// where AWS credentials are read from.
var credentialPrefixes = []string{"AWS_"}

// credentialNames are credentials no suffix rule catches, or whose catching should not depend on one.
var credentialNames = []string{
	"GITHUB_TOKEN", "GH_TOKEN", "NPM_TOKEN", "TOKEN", "SECRET", "PASSWORD", "API_KEY", "APIKEY",
	"GOOGLE_APPLICATION_CREDENTIALS", "DOCKER_AUTH_CONFIG", "SSH_AUTH_SOCK",
}

// credentialAllow are suffixes that end in _KEY but name a public value; the only exception to the rules
// above. Anything else that merely looks like a credential (SORT_KEY, CACHE_KEY) is stripped: set it in the
// spec, whose env is the operator's and is not stripped.
var credentialAllow = []string{"_PUBLIC_KEY"}

// DenyClass returns the deny class of an environment variable name, or "" when the repository may set it.
// Names are compared in upper case. The classes:
//
//	proxy       HTTP_PROXY HTTPS_PROXY NO_PROXY ALL_PROXY FTP_PROXY, in any case (http_proxy ...)
//	loader      LD_* (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT ...) and DYLD_*
//	startup     BASH_ENV ENV PROMPT_COMMAND PYTHONSTARTUP NODE_OPTIONS
//	credential  *_TOKEN *_SECRET *_PASSWORD *_KEY (except *_PUBLIC_KEY), AWS_*, and GITHUB_TOKEN GH_TOKEN
//	            NPM_TOKEN TOKEN SECRET PASSWORD API_KEY APIKEY GOOGLE_APPLICATION_CREDENTIALS
//	            DOCKER_AUTH_CONFIG SSH_AUTH_SOCK
func DenyClass(name string) string {
	n := strings.ToUpper(name)
	for _, p := range proxyNames {
		if n == p {
			return ClassProxy
		}
	}
	for _, p := range loaderPrefixes {
		if strings.HasPrefix(n, p) {
			return ClassLoader
		}
	}
	for _, s := range startupNames {
		if n == s {
			return ClassStartup
		}
	}
	for _, c := range credentialNames {
		if n == c {
			return ClassCredential
		}
	}
	for _, p := range credentialPrefixes {
		if strings.HasPrefix(n, p) {
			return ClassCredential
		}
	}
	for _, a := range credentialAllow {
		if strings.HasSuffix(n, a) {
			return ""
		}
	}
	for _, s := range credentialSuffixes {
		if strings.HasSuffix(n, s) {
			return ClassCredential
		}
	}
	return ""
}
