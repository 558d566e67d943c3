package main

import (
	"fmt"
	"os"
	"testing"
)

// TestMain keeps the command lines the tests run in-process (run(...), which a user's `sandkeep` would also
// run) away from the user's machine: they get a state home of their own, and no daemon (SANDKEEP_DAEMON=off).
// In auto mode an in-process exec would start "the daemon" from os.Executable, which here is the test binary:
// it exits at once on flags it does not know, and the call waits daemonStartWait (15 s) for an answer that
// never comes before it runs in-process anyway. The CLI suite's built binaries get their own environment
// (newCLI, cleanEnv), through the daemon or not as SANDKEEP_TEST_DAEMON says.
func TestMain(m *testing.M) {
	home, err := os.MkdirTemp("", "sandkeep-test-home-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for k, v := range map[string]string{"SANDKEEP_HOME": home, "SANDKEEP_DAEMON": "off"} {
		if err := os.Setenv(k, v); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	_ = os.RemoveAll(home)
	os.Exit(code)
}
