package api

import (
	"bufio"
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/store"
)

func TestRuns(t *testing.T) {
	e := newEnv(t, nil)
	for _, u := range []string{"alice", "alice", "bob"} {
		readAll(t, e.exec(u, `{"argv":["true"]}`))
		time.Sleep(2 * time.Millisecond) // distinct creation times
	}
	foreign := e.be.AddRun(store.Run{Tenant: "globex", User: "alice", Trust: store.TrustTrusted, Admission: store.AdmissionAdmitted})

	all := decodeJSON[RunList](t, e.req("GET", "/v1/runs", e.tok, nil)).Runs
	if len(all) != 3 || all[0].User != "bob" {
		t.Fatalf("runs %+v", all)
	}
	for _, r := range all {
		if r.Tenant != "acme" || r.Status != store.StatusSucceeded {
			t.Errorf("run %+v", r)
		}
	}
	for _, tc := range []struct {
		query string
		want  int
	}{
		{"user=bob", 1},
		{"user=alice&limit=1", 1},
		{"status=running", 0},
		{"status=succeeded", 3},
		{"before=" + url.QueryEscape(all[0].CreatedAt.Format(time.RFC3339Nano)), 2},
	} {
		if got := decodeJSON[RunList](t, e.req("GET", "/v1/runs?"+tc.query, e.tok, nil)).Runs; len(got) != tc.want {
			t.Errorf("?%s: %d runs, want %d", tc.query, len(got), tc.want)
		}
	}
	for _, q := range []string{"tenant=globex", "status=bogus", "limit=-1", "limit=100000", "before=yesterday", "user=a&user=b"} {
		wantError(t, e.req("GET", "/v1/runs?"+q, e.tok, nil), http.StatusBadRequest, "REQUEST_INVALID")
	}

	run := decodeJSON[store.Run](t, e.req("GET", "/v1/runs/"+all[0].ID, e.tok, nil))
	if run.ID != all[0].ID {
		t.Errorf("run %+v", run)
	}
	a := wantError(t, e.req("GET", "/v1/runs/"+foreign.ID, e.tok, nil), http.StatusNotFound, "RUN_NOT_FOUND")
	if strings.Contains(a.Message+a.Hint, "globex") {
		t.Errorf("answer names the other tenant: %+v", a)
	}
	wantError(t, e.req("GET", "/v1/runs/"+strings.Repeat("x", 200), e.tok, nil), http.StatusNotFound, "RUN_NOT_FOUND")

	evs := decodeJSON[EventList](t, e.req("GET", "/v1/runs/"+run.ID+"/events", e.tok, nil)).Events
	if len(evs) < 2 || evs[len(evs)-2].Name != "exec_started" || evs[len(evs)-1].Name != "exec_finished" {
		t.Fatalf("events %+v", evs)
	}
	later := decodeJSON[EventList](t, e.req("GET", "/v1/runs/"+run.ID+"/events?after="+itoa(evs[0].Seq), e.tok, nil)).Events
	if len(later) != len(evs)-1 {
		t.Errorf("after=%d: %d events, want %d", evs[0].Seq, len(later), len(evs)-1)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// sse reads SSE messages from resp, each as its "field: value" lines joined by "|".
func sse(t *testing.T, resp *http.Response) <-chan string {
	t.Helper()
	ch := make(chan string, 100)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(resp.Body)
		var msg []string
		for sc.Scan() {
			if sc.Text() == "" {
				ch <- strings.Join(msg, "|")
				msg = nil
				continue
			}
			msg = append(msg, sc.Text())
		}
	}()
	return ch
}

func next(t *testing.T, ch <-chan string) (string, bool) {
	t.Helper()
	select {
	case m, ok := <-ch:
		return m, ok
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for an SSE message")
	}
	return "", false
}

func TestEventsFollow(t *testing.T) {
	e := newEnv(t, nil)
	run := e.be.AddRun(store.Run{Tenant: "acme", User: "alice", Trust: store.TrustTrusted, Admission: store.AdmissionAdmitted})
	e.be.AppendEvent(store.Event{RunID: run.ID, Name: "exec_started", Payload: []byte(`{"command":"a"}`)})
	resp := e.req("GET", "/v1/runs/"+run.ID+"/events?follow=1", e.tok, nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != ctSSE {
		t.Fatalf("follow: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	msgs := sse(t, resp)
	if m, _ := next(t, msgs); !strings.HasPrefix(m, "id: 1|event: exec_started|data: {\"seq\":1,") {
		t.Fatalf("first message %q", m)
	}
	e.be.AppendEvent(store.Event{RunID: run.ID, Name: "exec_finished", Payload: []byte(`{"exit_code":0}`)})
	if m, _ := next(t, msgs); !strings.HasPrefix(m, "id: 2|event: exec_finished|") {
		t.Fatalf("second message %q", m)
	}
	e.be.AppendEvent(store.Event{RunID: run.ID, Name: "sandbox_removed", Payload: []byte(`{"sandbox":"s"}`)})
	e.be.FinishRun(run.ID, store.StatusSucceeded)
	if m, _ := next(t, msgs); !strings.HasPrefix(m, "id: 3|event: sandbox_removed|") {
		t.Fatalf("third message %q", m)
	}
	if m, _ := next(t, msgs); m != "event: end|data: {}" {
		t.Fatalf("last message %q", m)
	}
	if m, ok := next(t, msgs); ok {
		t.Fatalf("after the end: %q", m)
	}

	// A reconnecting client resumes after Last-Event-ID.
	resp = e.req("GET", "/v1/runs/"+run.ID+"/events?follow=1", e.tok, nil, "Last-Event-ID", "2")
	msgs = sse(t, resp)
	if m, _ := next(t, msgs); !strings.HasPrefix(m, "id: 3|") {
		t.Fatalf("resumed with %q", m)
	}
	if m, _ := next(t, msgs); m != "event: end|data: {}" {
		t.Fatalf("resumed stream ends with %q", m)
	}
	wantError(t, e.req("GET", "/v1/runs/"+run.ID+"/events?follow=1", e.tok, nil, "Last-Event-ID", "x"), 400, "REQUEST_INVALID")
}

func TestDrainEndsEventStreams(t *testing.T) {
	e := newEnv(t, nil)
	run := e.be.AddRun(store.Run{Tenant: "acme", User: "alice", Trust: store.TrustTrusted, Admission: store.AdmissionAdmitted})
	resp := e.req("GET", "/v1/runs/"+run.ID+"/events?follow=1", e.tok, nil)
	msgs := sse(t, resp)
	time.Sleep(30 * time.Millisecond) // a few polls
	if err := e.srv.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m, ok := next(t, msgs); ok {
		t.Fatalf("message %q after drain", m)
	}
}
