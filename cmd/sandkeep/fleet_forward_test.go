package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	sdk "github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/fleet"
	"github.com/sandkeep/sandkeep/internal/store/postgres"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestFleetForwardAll: everything of a key reaches its owner from the replica that does not own it, through the
// real API of two `sandkeep serve` replicas: files (upload, list, download), a TTY command, a port forward,
// processes (start, list, input, output, signal) and streamed output. The key's lease stays with its owner
// throughout: the other replica served nothing itself.
func TestFleetForwardAll(t *testing.T) {
	c, reps, dsn := twoReplicas(t)
	tenant := c.ten("fwdall")
	tok := c.createToken(t, tenant, "fwd", "admin")
	owner, other := reps[0].client(t, tok.Token), reps[1].client(t, tok.Token)
	ctx := bounded(t)

	// Replica 0 takes the key.
	if res, err := owner.Exec(ctx, "alice", sdk.ExecRequest{Command: "echo owned"}); err != nil || res.Stdout != "owned\n" {
		t.Fatalf("exec on the owner: %+v %v", res, err)
	}
	st, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	key := keyOf(t, tenant, "alice")
	l, err := st.GetLease(t.Context(), fleet.LeaseName(key))
	if err != nil || !strings.Contains(reps[0].log.String(), "fleet replica "+l.Owner+",") {
		t.Fatalf("lease %+v, %v: want replica 0's", l, err)
	}

	// Files, through replica 1.
	if _, err := other.Upload(ctx, "alice", "notes/a.txt", strings.NewReader("forwarded file\n"), 0o644); err != nil {
		t.Fatalf("upload via the other replica: %v", err)
	}
	ents, err := other.List(ctx, "alice", "notes")
	if err != nil || len(ents) != 1 || ents[0].Name != "a.txt" {
		t.Fatalf("list via the other replica: %+v %v", ents, err)
	}
	var got bytes.Buffer
	if _, err := other.Download(ctx, "alice", "notes/a.txt", &got); err != nil || got.String() != "forwarded file\n" {
		t.Fatalf("download via the other replica: %q %v", got.String(), err)
	}
	if res, err := owner.Exec(ctx, "alice", sdk.ExecRequest{Command: "cat notes/a.txt"}); err != nil || res.Stdout != "forwarded file\n" {
		t.Fatalf("the owner's sandbox does not see the uploaded file: %+v %v", res, err)
	}

	// A terminal, through replica 1.
	in, inW := io.Pipe()
	defer inW.Close()
	screen := newScreen()
	type answer struct {
		res *sdk.ExecResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := other.ExecTTY(ctx, "alice", sdk.ExecRequest{Argv: []string{"sh"}, Timeout: time.Minute},
			sdk.TTY{Input: in, Output: screen, Size: sdk.WindowSize{Rows: 33, Cols: 101}})
		done <- answer{res, err}
	}()
	io.WriteString(inW, "stty size | tr ' ' x; echo sum-$((20+22))\r")
	screen.wait(t, "33x101")
	screen.wait(t, "sum-42")
	io.WriteString(inW, "exit 4\r")
	if a := <-done; a.err != nil || a.res.ExitCode != 4 {
		t.Fatalf("tty via the other replica: %+v %v", a.res, a.err)
	}

	// A port forward, through replica 1, to a server started through replica 1.
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	ready := newScreen()
	served := make(chan error, 1)
	go func() {
		_, err := other.ExecStream(sctx, "alice", sdk.ExecRequest{Argv: []string{testutil.ProbePath, "serve", "127.0.0.1:8080", "via-fleet"},
			Timeout: 5 * time.Minute}, ready, nil)
		served <- err
	}()
	ready.wait(t, "listening")
	conn, err := other.DialPort(ctx, "alice", 8080)
	if err != nil {
		t.Fatalf("port forward via the other replica: %v", err)
	}
	fmt.Fprintf(conn, "GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	conn.Close()
	if string(body) != "via-fleet /x" {
		t.Fatalf("port forward body %q", body)
	}
	stop()
	<-served

	// Processes, through replica 1.
	if c.processesServed() {
		p, err := other.StartProcess(ctx, "alice", sdk.StartRequest{Command: "echo ready; while read l; do echo got $l; done; sleep 600",
			Tag: "dev", Stdin: true, Lifetime: 5 * time.Minute})
		if err != nil || !p.Running {
			t.Fatalf("start via the other replica: %+v %v", p, err)
		}
		ps, err := other.Processes(ctx, "alice")
		if err != nil || len(ps) != 1 || ps[0].PID != p.PID {
			t.Fatalf("processes via the other replica: %+v %v", ps, err)
		}
		dev := sdk.ProcessRef{Tag: "dev"}
		if err := other.Input(ctx, "alice", dev, []byte("one\n")); err != nil {
			t.Fatalf("input via the other replica: %v", err)
		}
		var out bytes.Buffer
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			out.Reset()
			if _, err := other.ProcessOutput(ctx, "alice", dev, sdk.AttachOptions{}, &out, nil); err != nil {
				t.Fatalf("output via the other replica: %v", err)
			}
			if out.String() == "ready\ngot one\n" {
				break
			}
		}
		if out.String() != "ready\ngot one\n" {
			t.Fatalf("process output via the other replica: %q", out.String())
		}
		if err := other.Signal(ctx, "alice", dev, "TERM"); err != nil {
			t.Fatalf("signal via the other replica: %v", err)
		}
		end, err := other.ProcessOutput(ctx, "alice", dev, sdk.AttachOptions{Follow: true}, io.Discard, nil)
		if err != nil || end.Running || end.Signal != 15 {
			t.Fatalf("the signalled process: %+v %v", end, err)
		}
	}

	// The key never moved: replica 0 served all of it.
	if l2, err := st.GetLease(t.Context(), fleet.LeaseName(key)); err != nil || l2.Owner != l.Owner || l2.Token != l.Token {
		t.Fatalf("lease after the forwards %+v, %v; want %+v", l2, err, l)
	}
	if perKey := containersPerKey(t, c); perKey[key.Hex()] != 1 {
		t.Errorf("containers by key %v: want 1 for alice", perKey)
	}
}
