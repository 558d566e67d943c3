package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/sandkeep/sandkeep/cmd/sandkeep/internal/fastpath"
)

// cobraReads is what cobra makes of args: the top-level command, the global flags, and what the fast path
// decides on (--log-level given, exec -t, --spec). ok is false when cobra refuses the command line.
func cobraReads(args []string) (call fastpath.Call, ok bool) {
	root, g := newRoot(strings.NewReader(""), io.Discard, io.Discard)
	cmd, rest, err := root.Find(args)
	if err != nil || cmd == root {
		return call, false
	}
	cmd.InitDefaultHelpFlag()
	if err := cmd.ParseFlags(rest); err != nil {
		return call, false
	}
	if cmd.Flags().Changed("help") {
		return call, false
	}
	top := cmd
	for top.HasParent() && top.Parent().HasParent() {
		top = top.Parent()
	}
	call.Command = top.Name()
	call.Globals = fastpath.Globals{Home: g.home, Image: g.image, Agent: g.agent, Transport: g.transport, Store: g.store}
	call.LogLevel = cmd.Flags().Changed("log-level")
	call.TTY = interactive(cmd)
	if f := cmd.Flags().Lookup("spec"); f != nil {
		call.Spec = f.Value.String()
	}
	return call, true
}

// agree checks that the fast path reads args as cobra does whenever it takes them.
func agree(t *testing.T, args []string) (taken bool) {
	t.Helper()
	fast, ok := fastpath.Parse(args)
	if !ok {
		return false
	}
	if !routedCommands[fast.Command] {
		t.Fatalf("%q: the fast path takes %s, which the daemon does not serve", args, fast.Command)
	}
	slow, cok := cobraReads(args)
	if !cok {
		// A value cobra refuses (a bad duration, an unknown log level): the daemon runs the same cobra tree on
		// the same arguments and reports the same usage error, so this is not a difference; but the command
		// and the flags the fast path decides on must still be cobra's reading of a well-formed line.
		return true
	}
	if fast != slow {
		t.Fatalf("%q: the fast path reads %+v, cobra %+v", args, fast, slow)
	}
	return true
}

// mainRoutes are the commands the daemon serves that the fast path leaves to main's own route to the daemon:
// port-forward lives as long as its forward, and fork copies a workspace, so their start-up time does not matter;
// proc and snapshot are groups of subcommands, which the fast path never takes.
var mainRoutes = map[string]bool{"port-forward": true, "fork": true, "proc": true, "snapshot": true}

// TestFastPathFlags: every flag of every command the daemon serves, in each form, is read by the fast path as
// cobra reads it; a flag added to a command and not to the fast path's table fails here. Commands the daemon
// does not serve, subcommands and --help are left to main.
func TestFastPathFlags(t *testing.T) {
	root, _ := newRoot(strings.NewReader(""), io.Discard, io.Discard)
	for _, c := range root.Commands() {
		if !routedCommands[c.Name()] || mainRoutes[c.Name()] {
			if _, ok := fastpath.Parse([]string{c.Name()}); ok {
				t.Errorf("the fast path takes %s, which it leaves to main", c.Name())
			}
			continue
		}
		if !agree(t, []string{c.Name()}) {
			t.Errorf("the fast path does not take %s", c.Name())
		}
		for _, sub := range c.Commands() {
			if _, ok := fastpath.Parse([]string{c.Name(), sub.Name()}); ok {
				t.Errorf("the fast path takes %s %s (a subcommand)", c.Name(), sub.Name())
			}
		}
		c.InitDefaultHelpFlag()
		visit := func(f *pflag.Flag) {
			value := "1KiB" // output-limit's byte size
			switch f.Value.Type() {
			case "string", "stringArray":
				value = "v1"
			case "duration":
				value = "3s"
			case "int":
				value = "3"
			}
			forms := [][]string{{"--" + f.Name + "=" + value}}
			if f.NoOptDefVal != "" { // a boolean
				forms = [][]string{{"--" + f.Name}, {"--" + f.Name + "=false"}, {"--" + f.Name + "=true"}}
			} else {
				forms = append(forms, []string{"--" + f.Name, value})
			}
			if f.Shorthand != "" {
				if f.NoOptDefVal != "" {
					forms = append(forms, []string{"-" + f.Shorthand}, []string{"-" + f.Shorthand + "=false"})
				} else {
					forms = append(forms, []string{"-" + f.Shorthand, value}, []string{"-" + f.Shorthand + value}, []string{"-" + f.Shorthand + "=" + value})
				}
			}
			for _, form := range forms {
				args := append([]string{c.Name()}, form...)
				if c.Name() == "exec" {
					args = append(args, "--", "true")
				}
				taken := agree(t, args)
				if want := f.Name != "help"; taken != want { // --log-level is taken, and then left to main (Call.LogLevel)
					t.Errorf("%s %q: taken by the fast path %v, want %v", c.Name(), form, taken, want)
				}
			}
		}
		c.LocalFlags().VisitAll(visit)
		c.InheritedFlags().VisitAll(visit)
	}
	// Global flags before the command, a grouped shorthand, a command's own arguments.
	for _, args := range [][]string{
		{"--home", "/h", "--image=i", "exec", "--user", "u", "--agent", "a", "-it", "--", "sh", "-c", "x"},
		{"--store", "s", "--transport", "agent", "exec", "--user", "u", "true", "--home", "x"},
		{"exec", "-ie", "A=1", "-w", "sub", "--spec", "rel/sk.yaml", "cat", "-"},
		{"ps", "--json", "--home=/h"},
		{"runs", "--limit", "3", "--user", "u"},
		{"doctor", "--strict", "--spec", "./s.yaml"},
	} {
		if !agree(t, args) {
			t.Errorf("the fast path does not take %q", args)
		}
	}
	for _, args := range [][]string{
		{"--transport", "exec", "exec", "true"}, // a global flag's value that names a command
		{"--user", "u", "exec", "true"},         // a command's flag before the command's name (cobra takes it; main does)
		{"exec", "--user"},                      // a missing value
		{"exec", "-x", "--", "true"},            // an unknown shorthand
		{"ps", "extra"},                         // an argument where none is taken
		{"exec", "--tty=maybe", "true"},         // a bad boolean
		{"exec", "-h"},                          // help
		{"help", "exec"},                        // cobra's help command
		{"--", "exec"},                          // no command before --
		{},                                      // no command at all
	} {
		if _, ok := fastpath.Parse(args); ok {
			t.Errorf("the fast path takes %q", args)
		}
	}
}

// FuzzFastPathParse: for any command line, the fast path either leaves it to main or reads it exactly as
// cobra does (command, global flags, --log-level, -t, --spec).
func FuzzFastPathParse(f *testing.F) {
	for _, s := range []string{
		"exec\x00--user\x00u\x00--\x00true",
		"--home\x00/h\x00exec\x00-it\x00--user\x00u\x00sh",
		"exec\x00-e\x00A=1\x00-eB=2\x00-e=C=3\x00--user=u\x00--\x00env",
		"ps\x00--json=false",
		"runs\x00--status\x00failed\x00--limit=2",
		"events\x00-f\x00--run\x00r1",
		"doctor\x00--spec\x00x.yaml\x00--log-level\x00debug",
		"exec\x00--spec\x00exec\x00--user\x00u\x00true",
		"--image\x00ps\x00ps",
		"exec\x00--\x00--home\x00x",
		"stop\x00--user\x00u\x00--tenant\x00t",
		"rm\x00--keep-workspace\x00--user\x00u",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		args := strings.Split(s, "\x00")
		if s == "" {
			args = nil
		}
		agree(t, args)
	})
}
