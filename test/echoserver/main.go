// Command echoserver is a tiny static TCP echo server (and its client) that tests run as a compose companion
// service: `echoserver serve ADDR` answers every line with "echo: LINE"; `echoserver ask ADDR TEXT` sends one
// line and prints the answer, exiting 1 when it cannot connect within two seconds. Build with CGO_ENABLED=0.
package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: echoserver serve ADDR | ask ADDR TEXT")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		ln, err := net.Listen("tcp", os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("listening on", ln.Addr())
		for {
			c, err := ln.Accept()
			if err != nil {
				continue
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintf(c, "echo: %s\n", sc.Text())
				}
			}()
		}
	case "ask":
		if len(os.Args) < 4 {
			os.Exit(2)
		}
		c, err := net.DialTimeout("tcp", os.Args[2], 2*time.Second)
		if err != nil {
			fmt.Println("unreachable:", err)
			os.Exit(1)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "%s\n", os.Args[3])
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			fmt.Println("no answer:", err)
			os.Exit(1)
		}
		fmt.Print(line)
	default:
		os.Exit(2)
	}
}
