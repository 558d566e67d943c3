package client_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/client"
)

// serverURL and token are those of a test server (see TestMain); in a program they are the address of
// `sandkeep serve` and a token from `sandkeep token create`.

func ExampleClient_Exec() {
	c, err := client.New(serverURL, token)
	if err != nil {
		panic(err)
	}
	res, err := c.Exec(context.Background(), "alice", client.ExecRequest{
		Argv:    []string{"echo", "hello"},
		Timeout: 30 * time.Second,
	})
	if err != nil {
		panic(err)
	}
	fmt.Printf("exit %d: %s", res.ExitCode, res.Stdout)
	// Output: exit 0: hello
}

func ExampleClient_ExecStream() {
	c, _ := client.New(serverURL, token)
	// Output reaches os.Stdout and os.Stderr as the command produces it.
	res, err := c.ExecStream(context.Background(), "alice", client.ExecRequest{Argv: []string{"echo", "streamed"}},
		os.Stdout, os.Stderr)
	if err != nil {
		panic(err)
	}
	fmt.Println("exit", res.ExitCode)
	// Output:
	// streamed
	// exit 0
}

func ExampleClient_Upload() {
	c, _ := client.New(serverURL, token)
	ctx := context.Background()
	if _, err := c.Upload(ctx, "alice", "notes/todo.txt", strings.NewReader("write the docs\n"), 0o644); err != nil {
		panic(err)
	}
	var b bytes.Buffer
	if _, err := c.Download(ctx, "alice", "notes/todo.txt", &b); err != nil {
		panic(err)
	}
	fmt.Print(b.String())
	// Output: write the docs
}

func ExampleClient_List() {
	c, _ := client.New(serverURL, token)
	ctx := context.Background()
	_, _ = c.Upload(ctx, "carol", "src/main.go", strings.NewReader("package main\n"), 0)
	entries, err := c.List(ctx, "carol", "src")
	if err != nil {
		panic(err)
	}
	for _, e := range entries {
		fmt.Println(e.Name, e.Type, e.Size)
	}
	// Output: main.go file 13
}

// Errors carry the same codes as the library's.
func ExampleAPIError() {
	c, _ := client.New(serverURL, token)
	_, err := c.Sandbox(context.Background(), "nobody")
	switch sandkeep.CodeOf(err) {
	case "SANDBOX_NOT_FOUND":
		fmt.Println("no sandbox yet")
	case "":
		fmt.Println("not a sandkeep error:", err)
	}
	// Output: no sandbox yet
}

func ExampleClient_FollowEvents() {
	c, _ := client.New(serverURL, token)
	ctx := context.Background()
	if _, err := c.Exec(ctx, "dave", client.ExecRequest{Argv: []string{"true"}}); err != nil {
		panic(err)
	}
	runs, err := c.Runs(ctx, client.RunFilter{User: "dave", Limit: 1})
	if err != nil || len(runs) == 0 {
		panic(fmt.Sprint("no run: ", err))
	}
	// Prints each event as it is recorded, until the run is over (this one is: its command has ended).
	err = c.FollowEvents(ctx, runs[0].ID, 0, func(e client.Event) error {
		fmt.Println(e.Name)
		return nil
	})
	fmt.Println("followed to the end:", err == nil)
	// Output:
	// sandbox_started
	// exec_started
	// exec_finished
	// followed to the end: true
}
