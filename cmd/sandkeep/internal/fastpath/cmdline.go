package fastpath

import (
	"strconv"
	"strings"
)

// flagSpec is one flag of a command line: its one-letter shorthand (0: none) and whether it is a boolean (takes
// no value unless written --name=VALUE).
type flagSpec struct {
	short   byte
	boolean bool
}

// globalFlags are the root's persistent flags (cmd/sandkeep/main.go); help is cobra's own.
var globalFlags = map[string]flagSpec{
	"home": {}, "image": {}, "agent": {}, "log-level": {}, "transport": {}, "store": {},
}

// commandFlags are the local flags of the commands the daemon serves (cmd/sandkeep's routedCommands).
// TestFastPathFlags checks them against the cobra tree: a flag added there and not here fails it.
var commandFlags = map[string]map[string]flagSpec{
	"exec": {
		"allow": {}, "detach": {short: 'd', boolean: true}, "driver": {}, "env": {short: 'e'}, "gate-wait": {}, "interactive": {short: 'i', boolean: true},
		"host-state": {}, "json": {boolean: true}, "lifetime": {}, "network": {}, "network-inherit": {}, "network-preset": {}, "output-limit": {},
		"run": {}, "sandbox": {}, "spec": {}, "tag": {}, "tenant": {}, "timeout": {}, "trust": {}, "tty": {short: 't', boolean: true},
		"user": {}, "workdir": {short: 'w'},
	},
	"doctor": {"driver": {}, "json": {boolean: true}, "sandbox": {}, "seccomp-install": {}, "seccomp-profile": {boolean: true}, "spec": {}, "strict": {boolean: true}, "timeout": {}},
	"events": {"follow": {short: 'f', boolean: true}, "interval": {}, "json": {boolean: true}, "run": {}},
	"ps":     {"json": {boolean: true}},
	"rm":     {"keep-workspace": {boolean: true}, "tenant": {}, "user": {}},
	"runs":   {"json": {boolean: true}, "limit": {}, "status": {}, "tenant": {}, "user": {}},
	"stop":   {"tenant": {}, "user": {}},
}

// ownArgs are the commands whose first word that is not a flag begins the sandboxed command's own arguments
// (cobra's SetInterspersed(false)); the others take no positional argument at all.
var ownArgs = map[string]bool{"exec": true}

// Call is what the fast path read from a command line that the daemon may serve.
type Call struct {
	Command  string  // the top-level command (exec, ps, ...)
	Globals  Globals // the global flags that are operator input, as given
	LogLevel bool    // --log-level was given: the call is for in-process work (its log goes to this stderr)
	TTY      bool    // exec -t: a terminal is this process's
	Spec     string  // --spec's value ("" when absent)
}

// Parse reads args (the command line without the program name) the way cobra and pflag read it for the
// commands in commandFlags, for the forms it knows: long flags (--name VALUE, --name=VALUE, a boolean --name or
// --name=BOOL), shorthands (-e VALUE, -eVALUE, -e=VALUE, grouped booleans -it), and "--". ok is false for
// anything else (another command, a subcommand, --help, an unknown flag, a missing value, a positional argument
// where the command takes none): the caller then leaves the command line to cobra.
func Parse(args []string) (call Call, ok bool) {
	var flags map[string]flagSpec // nil until the command's name is seen
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return call, flags != nil
		case strings.HasPrefix(a, "--"):
			name, value, hasValue := strings.Cut(a[2:], "=")
			spec, known := lookup(flags, name)
			if !known {
				return call, false
			}
			if !spec.boolean && !hasValue {
				if i+1 == len(args) {
					return call, false
				}
				i++
				value, hasValue = args[i], true
			}
			if !call.set(flags, name, spec, value, hasValue) {
				return call, false
			}
		case strings.HasPrefix(a, "-") && len(a) > 1:
			shorts := a[1:]
			for len(shorts) > 0 {
				name, spec, known := lookupShort(flags, shorts[0])
				if !known {
					return call, false
				}
				var value string
				hasValue := false
				switch {
				case len(shorts) > 2 && shorts[1] == '=':
					value, hasValue, shorts = shorts[2:], true, ""
				case spec.boolean:
					shorts = shorts[1:]
				case len(shorts) > 1:
					value, hasValue, shorts = shorts[1:], true, ""
				case i+1 < len(args):
					i++
					value, hasValue, shorts = args[i], true, ""
				default:
					return call, false
				}
				if !call.set(flags, name, spec, value, hasValue) {
					return call, false
				}
			}
		case flags == nil:
			f, known := commandFlags[a]
			if !known {
				return call, false
			}
			call.Command, flags = a, f
		default: // a positional argument
			return call, ownArgs[call.Command]
		}
	}
	return call, flags != nil
}

// set records one flag's value; false for what the fast path does not take (help, a bad boolean, a global
// flag's value that names a command: cobra's search for the command would read it otherwise).
func (c *Call) set(flags map[string]flagSpec, name string, spec flagSpec, value string, hasValue bool) bool {
	if name == "help" {
		return false
	}
	if spec.boolean {
		b := true
		if hasValue {
			var err error
			if b, err = strconv.ParseBool(value); err != nil {
				return false
			}
		}
		if name == "tty" && flags != nil {
			c.TTY = b
		}
		return true
	}
	if _, local := flags[name]; local {
		if name == "spec" {
			c.Spec = value
		}
		return true
	}
	if flags == nil {
		if _, isCommand := commandFlags[value]; isCommand {
			return false
		}
	}
	switch name {
	case "home":
		c.Globals.Home = value
	case "image":
		c.Globals.Image = value
	case "agent":
		c.Globals.Agent = value
	case "transport":
		c.Globals.Transport = value
	case "store":
		c.Globals.Store = value
	case "log-level":
		c.LogLevel = true
	}
	return true
}

// lookup finds a long flag: the command's own (once its name was seen), a global one, or help.
func lookup(flags map[string]flagSpec, name string) (flagSpec, bool) {
	if s, ok := flags[name]; ok {
		return s, true
	}
	if s, ok := globalFlags[name]; ok {
		return s, true
	}
	if name == "help" {
		return flagSpec{short: 'h', boolean: true}, true
	}
	return flagSpec{}, false
}

func lookupShort(flags map[string]flagSpec, c byte) (string, flagSpec, bool) {
	if c == 'h' {
		return "help", flagSpec{short: 'h', boolean: true}, true
	}
	for name, s := range flags {
		if s.short == c {
			return name, s, true
		}
	}
	for name, s := range globalFlags {
		if s.short == c {
			return name, s, true
		}
	}
	return "", flagSpec{}, false
}
