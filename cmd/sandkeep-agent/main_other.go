//go:build !linux

// Command sandkeep-agent is the in-sandbox helper; it runs on Linux only.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "sandkeep-agent: Linux only")
	os.Exit(2)
}
