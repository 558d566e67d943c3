package api

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// outputLines reads a process's output stream as NDJSON lines.
func outputLines(t *testing.T, e *env, path string) []string {
	t.Helper()
	resp := e.req("GET", path, e.tok, nil, "Accept", ctNDJSON)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != ctNDJSON {
		t.Fatalf("%s: %d %s %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), readAll(t, resp))
	}
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

// TestProcessRoutes: a process is started detached (201 with its pid), listed, written to, read back (the ring
// without following, as `docker logs`), signalled and killed by pid or tag, each through its route; bad input
// is refused before anything happens.
func TestProcessRoutes(t *testing.T) {
	e := newEnv(t, nil)
	const base = "/v1/sandboxes/alice/processes"
	resp := e.req("POST", base, e.tok, strings.NewReader(`{"command":"npm run dev","tag":"dev","stdin":true,"lifetime":600}`))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("start: %d %s", resp.StatusCode, readAll(t, resp))
	}
	started := decodeJSON[ProcessResponse](t, resp)
	if started.PID <= 0 || started.Tag != "dev" || !started.Running || !started.Stdin || started.RequestID == "" ||
		strings.Join(started.Argv, " ") != "sh -c npm run dev" {
		t.Fatalf("started %+v", started)
	}
	list := decodeJSON[ProcessList](t, e.req("GET", base, e.tok, nil))
	if len(list.Processes) != 1 || list.Processes[0].PID != started.PID {
		t.Fatalf("list %+v", list)
	}
	if resp := e.req("POST", base+"/dev/input", e.tok, strings.NewReader(`{"data":"one\n","close":true}`)); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("input: %d %s", resp.StatusCode, readAll(t, resp))
	}
	lines := outputLines(t, e, base+"/dev/output?follow=0")
	if len(lines) != 2 || lines[0] != `{"stream":"stdout","data":"started: sh -c npm run dev\none\nstdin closed\n"}` {
		t.Fatalf("output:\n%s", strings.Join(lines, "\n"))
	}
	var final struct {
		Result ProcessResponse `json:"result"`
	}
	if err := json.Unmarshal([]byte(lines[1]), &final); err != nil || !final.Result.Running || final.Result.Stdin {
		t.Fatalf("final %s %v", lines[1], err)
	}
	// Input after close, an unknown signal, an unknown tag and a bad lifetime are refused.
	wantError(t, e.req("POST", base+"/dev/input", e.tok, strings.NewReader(`{"data":"x"}`)), http.StatusBadRequest, "INVALID_ARGUMENT")
	wantError(t, e.req("POST", base+"/dev/signal", e.tok, strings.NewReader(`{"signal":"NOPE"}`)), http.StatusBadRequest, "INVALID_ARGUMENT")
	wantError(t, e.req("POST", base+"/nope/kill", e.tok, nil), http.StatusNotFound, "PROCESS_NOT_FOUND")
	wantError(t, e.req("POST", base, e.tok, strings.NewReader(`{"argv":["x"],"lifetime":1e9}`)), http.StatusBadRequest, "INVALID_TIMEOUT")
	wantError(t, e.req("POST", base, e.tok, strings.NewReader(`{"argv":["x"],"bogus":1}`)), http.StatusBadRequest, "REQUEST_INVALID")

	if resp := e.req("POST", base+"/dev/signal", e.tok, strings.NewReader(`{"signal":"HUP"}`)); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("signal: %d %s", resp.StatusCode, readAll(t, resp))
	}
	pid := started.PID
	if resp := e.req("POST", base+"/"+itoa(int64(pid))+"/kill", e.tok, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("kill: %d %s", resp.StatusCode, readAll(t, resp))
	}
	wantError(t, e.req("POST", base+"/dev/kill", e.tok, nil), http.StatusConflict, "PROCESS_EXITED")
	// Following an ended process replays its output and ends with it.
	lines = outputLines(t, e, base+"/"+itoa(int64(pid))+"/output")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &final); err != nil || final.Result.Running || !final.Result.Killed {
		t.Fatalf("after kill: %s %v", lines[len(lines)-1], err)
	}
}
