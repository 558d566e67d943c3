// Package storetest is the conformance suite every store.Store passes (runs, events and API tokens): the SQLite
// and PostgreSQL stores, and any fake that stands in for them.
//
// The multi-process test re-executes the test binary: the suite, running in a child started with the
// SANDKEEP_STORETEST_WRITER environment variable, becomes a writer instead of running its tests. So a test that
// calls Run must let the child reach Run again: the child is started with -test.run naming the top-level test.
package storetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
)

// Option extends what the suite checks.
type Option func(*config)

type config struct {
	location func(t *testing.T) string
	openAt   func(ctx context.Context, location string) (store.Store, error)
}

// MultiProcess enables the multi-process test for a store shared through a database: location returns where a
// fresh, empty store lives for one test (a file path, a DSN), and openAt opens the store at a location. The
// writer processes call openAt too, so it must not depend on anything but its arguments.
func MultiProcess(location func(t *testing.T) string, openAt func(ctx context.Context, location string) (store.Store, error)) Option {
	return func(c *config) {
		c.location = location
		c.openAt = openAt
	}
}

// Environment of a writer process.
const (
	envWriter   = "SANDKEEP_STORETEST_WRITER"          // the writer's index; set only in writer processes
	envLocation = "SANDKEEP_STORETEST_WRITER_LOCATION" // where the store is
)

const (
	writers         = 3
	eventsPerWriter = 100
	readyLine       = "storetest: writer ready"
)

// Run runs the suite. open returns a fresh, empty store for one test; the suite closes it.
func Run(t *testing.T, open func(t *testing.T) store.Store, opts ...Option) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if os.Getenv(envWriter) != "" {
		runWriter(t, c)
		return
	}
	get := func(t *testing.T) store.Store {
		t.Helper()
		s := open(t)
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("close store: %v", err)
			}
		})
		return s
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"RunLifecycle", testRunLifecycle},
		{"CreateRunDefaults", testCreateRunDefaults},
		{"CreateRunInvalid", testCreateRunInvalid},
		{"CreateRunDuplicate", testCreateRunDuplicate},
		{"UpdateRunInvalid", testUpdateRunInvalid},
		{"NotFound", testNotFound},
		{"ListRuns", testListRuns},
		{"QueryRuns", testQueryRuns},
		{"EventAggregates", testEventAggregates},
		{"Events", testEvents},
		{"EventPayloadRoundTrip", testEventPayloadRoundTrip},
		{"EventInvalid", testEventInvalid},
		{"ConcurrentAppend", testConcurrentAppend},
		{"ConcurrentFinish", testConcurrentFinish},
		{"EnqueuedEvents", testEnqueuedEvents},
		{"EnqueuedFailure", testEnqueuedFailure},
		{"TokenLifecycle", testTokenLifecycle},
		{"TokenDefaults", testTokenDefaults},
		{"TokenExpired", testTokenExpired},
		{"TokenInvalid", testTokenInvalid},
		{"TokenDuplicate", testTokenDuplicate},
		{"TokenNotFound", testTokenNotFound},
		{"ListTokens", testListTokens},
		{"ConcurrentTokenName", testConcurrentTokenName},
		{"LeaseLifecycle", testLeaseLifecycle},
		{"LeaseTakeover", testLeaseTakeover},
		{"LeaseRace", testLeaseRace},
		{"LeaseList", testLeaseList},
		{"LeaseOrdering", testLeaseOrdering},
		{"RunLogs", testRunLogs},
		{"RunLogBound", testRunLogBound},
		{"Snapshots", testSnapshots},
		{"ConcurrentSnapshots", testConcurrentSnapshots},
		{"E2BSandboxes", testE2BSandboxes},
		{"E2BConcurrentUpdate", testE2BConcurrentUpdate},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, get(t)) })
	}
	t.Run("WrittenThrough", func(t *testing.T) {
		if c.openAt == nil {
			t.Skip("store is not shared between processes (no storetest.MultiProcess option)")
		}
		testWrittenThrough(t, c)
	})
	t.Run("MultiProcess", func(t *testing.T) {
		if c.openAt == nil {
			t.Skip("store is not shared between processes (no storetest.MultiProcess option)")
		}
		testMultiProcess(t, c)
	})
}

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newRun returns a valid running run with a fresh id.
func newRun(t *testing.T, tenant, user string) store.Run {
	t.Helper()
	id, err := store.NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	return store.Run{
		ID:            id,
		Tenant:        tenant,
		User:          user,
		Trust:         store.TrustTrusted,
		RequestedMode: "",
		ResolvedMode:  "auto",
		Source:        "default",
		Driver:        "docker",
		Admission:     store.AdmissionAdmitted,
		Status:        store.StatusRunning,
		CreatedAt:     time.Date(2025, 3, 4, 5, 6, 7, 891_000_000, time.UTC),
	}
}

func mustCreate(t *testing.T, s store.Store, r store.Run) {
	t.Helper()
	if err := s.CreateRun(ctxOf(t), r); err != nil {
		t.Fatalf("CreateRun(%s): %v", r.ID, err)
	}
}

func mustGet(t *testing.T, s store.Store, id string) store.Run {
	t.Helper()
	r, err := s.GetRun(ctxOf(t), id)
	if err != nil {
		t.Fatalf("GetRun(%s): %v", id, err)
	}
	return r
}

func sameRun(t *testing.T, got, want store.Run) {
	t.Helper()
	if !got.CreatedAt.Equal(want.CreatedAt) || got.CreatedAt.Location() != time.UTC {
		t.Errorf("run %s: CreatedAt = %v, want %v (UTC)", want.ID, got.CreatedAt, want.CreatedAt)
	}
	if !got.FinishedAt.Equal(want.FinishedAt) || (!got.FinishedAt.IsZero() && got.FinishedAt.Location() != time.UTC) {
		t.Errorf("run %s: FinishedAt = %v, want %v (UTC)", want.ID, got.FinishedAt, want.FinishedAt)
	}
	got.CreatedAt, want.CreatedAt = time.Time{}, time.Time{}
	got.FinishedAt, want.FinishedAt = time.Time{}, time.Time{}
	if got != want {
		t.Errorf("run read back:\n got %+v\nwant %+v", got, want)
	}
}

func wantErr(t *testing.T, what string, err, class error) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Errorf("%s: error %v, want %v", what, err, class)
	}
}

func testRunLifecycle(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	r := newRun(t, "acme", "alice")
	r.RequestedMode, r.ResolvedMode, r.Source, r.Trust = "inline", "inline", "cli", store.TrustUntrusted
	mustCreate(t, s, r)
	sameRun(t, mustGet(t, s, r.ID), r)

	finished := time.Date(2025, 3, 4, 5, 7, 0, 123_456_789, time.FixedZone("X", 3600))
	if err := s.UpdateRun(ctx, r.ID, store.RunUpdate{
		Status: store.StatusFailed, FailureCode: "SANDBOX_DRIVER_UNAVAILABLE",
		Disposition: store.DispositionDeterministic, FinishedAt: finished,
	}); err != nil {
		t.Fatalf("UpdateRun: %v", err)
	}
	want := r
	want.Status, want.FailureCode, want.Disposition = store.StatusFailed, "SANDBOX_DRIVER_UNAVAILABLE", store.DispositionDeterministic
	want.FinishedAt = finished.UTC().Truncate(time.Millisecond)
	sameRun(t, mustGet(t, s, r.ID), want)

	// A finished run stays as it is: no second finish, whatever the status.
	for _, st := range []string{store.StatusSucceeded, store.StatusFailed, store.StatusFailedResumable} {
		err := s.UpdateRun(ctx, r.ID, store.RunUpdate{Status: st})
		wantErr(t, "update finished run to "+st, err, errdefs.ErrFailedPrecondition)
	}
	sameRun(t, mustGet(t, s, r.ID), want)

	// Every final status can be reached from running; a zero FinishedAt becomes now.
	for _, upd := range []store.RunUpdate{
		{Status: store.StatusSucceeded},
		{Status: store.StatusFailedResumable, FailureCode: "SANDBOX_SETUP_TIMEOUT", Disposition: store.DispositionInfrastructure},
		{Status: store.StatusFailed},
	} {
		r := newRun(t, "acme", "bob")
		mustCreate(t, s, r)
		before := time.Now().UTC().Truncate(time.Millisecond)
		if err := s.UpdateRun(ctx, r.ID, upd); err != nil {
			t.Fatalf("UpdateRun(%+v): %v", upd, err)
		}
		got := mustGet(t, s, r.ID)
		if got.Status != upd.Status || got.FailureCode != upd.FailureCode || got.Disposition != upd.Disposition {
			t.Errorf("after %+v: run = %+v", upd, got)
		}
		if got.FinishedAt.Before(before) || got.FinishedAt.After(time.Now().Add(time.Second)) {
			t.Errorf("after %+v: FinishedAt = %v, want about now", upd, got.FinishedAt)
		}
	}
}

func testCreateRunDefaults(t *testing.T, s store.Store) {
	r := newRun(t, "acme", "alice")
	r.Status, r.CreatedAt = "", time.Time{}
	before := time.Now().UTC().Truncate(time.Millisecond)
	mustCreate(t, s, r)
	got := mustGet(t, s, r.ID)
	if got.Status != store.StatusRunning {
		t.Errorf("Status = %q, want running", got.Status)
	}
	if got.CreatedAt.Before(before) || got.CreatedAt.After(time.Now().Add(time.Second)) || !got.FinishedAt.IsZero() {
		t.Errorf("CreatedAt = %v, FinishedAt = %v: want about now and zero", got.CreatedAt, got.FinishedAt)
	}
	if got.CreatedAt.Nanosecond()%int(time.Millisecond) != 0 {
		t.Errorf("CreatedAt = %v: want millisecond precision", got.CreatedAt)
	}

	// A refusal is recorded as a run that is finished from the start.
	refused := newRun(t, "acme", "alice")
	refused.Admission, refused.Status, refused.Driver = store.AdmissionRefused, store.StatusFailed, ""
	refused.FailureCode, refused.Disposition = "UNTRUSTED_WITHOUT_SANDBOX", store.DispositionDeterministic
	mustCreate(t, s, refused)
	want := refused
	want.FinishedAt = refused.CreatedAt
	sameRun(t, mustGet(t, s, refused.ID), want)
	wantErr(t, "update refused run", s.UpdateRun(ctxOf(t), refused.ID, store.RunUpdate{Status: store.StatusSucceeded}),
		errdefs.ErrFailedPrecondition)
}

func testCreateRunInvalid(t *testing.T, s store.Store) {
	tests := []struct {
		name   string
		mutate func(r *store.Run)
	}{
		{"empty id", func(r *store.Run) { r.ID = "" }},
		{"empty trust", func(r *store.Run) { r.Trust = "" }},
		{"bad trust", func(r *store.Run) { r.Trust = "sometimes" }},
		{"bad admission", func(r *store.Run) { r.Admission = "maybe" }},
		{"bad status", func(r *store.Run) { r.Status = "paused" }},
		{"bad disposition", func(r *store.Run) { r.Status, r.Disposition = store.StatusFailed, "random" }},
		{"succeeded with failure code", func(r *store.Run) { r.Status, r.FailureCode = store.StatusSucceeded, "X" }},
		{"running with finish time", func(r *store.Run) { r.FinishedAt = r.CreatedAt }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRun(t, "acme", "alice")
			tt.mutate(&r)
			wantErr(t, "CreateRun", s.CreateRun(ctxOf(t), r), errdefs.ErrInvalidArgument)
			if r.ID != "" {
				_, err := s.GetRun(ctxOf(t), r.ID)
				wantErr(t, "GetRun after invalid create", err, errdefs.ErrNotFound)
			}
		})
	}
}

func testCreateRunDuplicate(t *testing.T, s store.Store) {
	r := newRun(t, "acme", "alice")
	mustCreate(t, s, r)
	dup := r
	dup.Tenant = "other"
	wantErr(t, "CreateRun twice", s.CreateRun(ctxOf(t), dup), errdefs.ErrAlreadyExists)
	sameRun(t, mustGet(t, s, r.ID), r)
}

func testUpdateRunInvalid(t *testing.T, s store.Store) {
	r := newRun(t, "acme", "alice")
	mustCreate(t, s, r)
	for _, upd := range []store.RunUpdate{
		{Status: store.StatusRunning},
		{Status: ""},
		{Status: "done"},
		{Status: store.StatusSucceeded, FailureCode: "X"},
		{Status: store.StatusSucceeded, Disposition: store.DispositionInfrastructure},
		{Status: store.StatusFailed, Disposition: "whatever"},
	} {
		wantErr(t, fmt.Sprintf("UpdateRun(%+v)", upd), s.UpdateRun(ctxOf(t), r.ID, upd), errdefs.ErrInvalidArgument)
	}
	sameRun(t, mustGet(t, s, r.ID), r)
}

func testNotFound(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	id, _ := store.NewRunID()
	_, err := s.GetRun(ctx, id)
	wantErr(t, "GetRun", err, errdefs.ErrNotFound)
	wantErr(t, "UpdateRun", s.UpdateRun(ctx, id, store.RunUpdate{Status: store.StatusSucceeded}), errdefs.ErrNotFound)
	e, err := events.New(id, events.NameSandboxAdopted, events.SandboxAdopted{Sandbox: "s", Driver: "docker"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.AppendEvent(ctx, e)
	wantErr(t, "AppendEvent to a missing run", err, errdefs.ErrNotFound)
	evs, err := s.ListEvents(ctx, store.EventFilter{RunID: id})
	if err != nil || len(evs) != 0 {
		t.Errorf("ListEvents of a missing run = %v, %v; want none", evs, err)
	}
	runs, err := s.ListRuns(ctx, store.RunFilter{Tenant: "nobody"})
	if err != nil || len(runs) != 0 {
		t.Errorf("ListRuns of nobody = %v, %v; want none", runs, err)
	}
}

func ids(runs []store.Run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.ID
	}
	return out
}

func testListRuns(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	type spec struct {
		tenant, user, status string
		at                   time.Duration
	}
	specs := []spec{ // created in this order, at base+at
		{"t1", "alice", store.StatusRunning, 1 * time.Millisecond},
		{"t1", "bob", store.StatusSucceeded, 2 * time.Millisecond},
		{"t2", "alice", store.StatusFailed, 3 * time.Millisecond},
		{"t1", "alice", store.StatusSucceeded, 4 * time.Second},
		{"t2", "carol", store.StatusRunning, 5 * time.Hour},
		{"t1", "alice", store.StatusFailedResumable, 5 * time.Hour}, // same time as the one before: id breaks the tie
	}
	all := make([]store.Run, len(specs))
	for i, sp := range specs {
		r := newRun(t, sp.tenant, sp.user)
		r.CreatedAt = base.Add(sp.at)
		r.Status = sp.status
		mustCreate(t, s, r)
		all[i] = mustGet(t, s, r.ID)
	}
	newest := slices.Clone(all)
	slices.Reverse(newest) // ids are UUIDv7 made in order, so the later one of a tie is also the greater id
	pick := func(idx ...int) []string {
		var out []string
		for _, i := range idx {
			out = append(out, all[i].ID)
		}
		return out
	}
	tests := []struct {
		name string
		f    store.RunFilter
		want []string
	}{
		{"all newest first", store.RunFilter{}, ids(newest)},
		{"tenant", store.RunFilter{Tenant: "t1"}, pick(5, 3, 1, 0)},
		{"user", store.RunFilter{User: "alice"}, pick(5, 3, 2, 0)},
		{"tenant and user", store.RunFilter{Tenant: "t1", User: "alice"}, pick(5, 3, 0)},
		{"status", store.RunFilter{Status: store.StatusRunning}, pick(4, 0)},
		{"limit", store.RunFilter{Limit: 2}, pick(5, 4)},
		{"before", store.RunFilter{Before: base.Add(4 * time.Second)}, pick(2, 1, 0)},
		{"before is strict", store.RunFilter{Before: base.Add(3 * time.Millisecond)}, pick(1, 0)},
		{"before below a millisecond", store.RunFilter{Before: base.Add(3*time.Millisecond + 500*time.Microsecond)}, pick(2, 1, 0)},
		{"before in another zone", store.RunFilter{Before: base.Add(4 * time.Second).In(time.FixedZone("Y", -7200))}, pick(2, 1, 0)},
		{"before with limit", store.RunFilter{Before: base.Add(5 * time.Hour), Limit: 2}, pick(3, 2)},
		{"everything", store.RunFilter{Tenant: "t1", User: "alice", Status: store.StatusSucceeded, Before: base.Add(5 * time.Hour), Limit: 10}, pick(3)},
		{"no match", store.RunFilter{Tenant: "t3"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.ListRuns(ctx, tt.f)
			if err != nil {
				t.Fatalf("ListRuns(%+v): %v", tt.f, err)
			}
			if !slices.Equal(ids(got), tt.want) {
				t.Errorf("ListRuns(%+v) = %v, want %v", tt.f, ids(got), tt.want)
			}
		})
	}
	got, err := s.ListRuns(ctx, store.RunFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		sameRun(t, got[i], newest[i])
	}
	_, err = s.ListRuns(ctx, store.RunFilter{Limit: -1})
	wantErr(t, "ListRuns with a negative limit", err, errdefs.ErrInvalidArgument)
}

func seqs(evs []store.Event) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = e.Seq
	}
	return out
}

func testEvents(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	r1, r2 := newRun(t, "acme", "alice"), newRun(t, "acme", "bob")
	mustCreate(t, s, r1)
	mustCreate(t, s, r2)

	var appended []store.Event
	add := func(runID, name string, payload any, requestID string) {
		t.Helper()
		e, err := events.New(runID, name, payload)
		if err != nil {
			t.Fatal(err)
		}
		e.RequestID = requestID
		e.Seq = 999 // ignored: the store assigns seqs
		seq, err := s.AppendEvent(ctx, e)
		if err != nil {
			t.Fatalf("AppendEvent(%s): %v", name, err)
		}
		if n := len(appended); n > 0 && seq <= appended[n-1].Seq {
			t.Errorf("seq %d after %d: want strictly increasing", seq, appended[n-1].Seq)
		}
		e.Seq = seq
		appended = append(appended, e)
	}
	add(r1.ID, events.NameExecStarted, events.ExecStarted{Command: "make", Transport: "agent"}, "req-1")
	add(r2.ID, events.NameSandboxStarted, events.SandboxStarted{Sandbox: "sandkeep-u-1", Driver: "docker", Created: true}, "")
	add(r1.ID, events.NameExecFinished, events.ExecFinished{ExitCode: 2, DurationMS: 40}, "req-1")
	add("", events.NameSandboxStoppedIdle, events.SandboxStoppedIdle{Sandbox: "sandkeep-u-2", IdleMS: 1000}, "")
	add(r1.ID, events.NameSandboxRecycled, events.SandboxRecycled{Reason: events.RecycleImage, Sandbox: "s"}, "")

	pick := func(idx ...int) []store.Event {
		var out []store.Event
		for _, i := range idx {
			out = append(out, appended[i])
		}
		return out
	}
	tests := []struct {
		name string
		f    store.EventFilter
		want []store.Event
	}{
		{"all", store.EventFilter{}, appended},
		{"run", store.EventFilter{RunID: r1.ID}, pick(0, 2, 4)},
		{"other run", store.EventFilter{RunID: r2.ID}, pick(1)},
		{"after seq", store.EventFilter{AfterSeq: appended[1].Seq}, pick(2, 3, 4)},
		{"run after seq", store.EventFilter{RunID: r1.ID, AfterSeq: appended[0].Seq}, pick(2, 4)},
		{"limit", store.EventFilter{Limit: 2}, pick(0, 1)},
		{"after seq and limit", store.EventFilter{AfterSeq: appended[0].Seq, Limit: 2}, pick(1, 2)},
		{"after the last", store.EventFilter{AfterSeq: appended[4].Seq}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.ListEvents(ctx, tt.f)
			if err != nil {
				t.Fatalf("ListEvents(%+v): %v", tt.f, err)
			}
			if !slices.Equal(seqs(got), seqs(tt.want)) {
				t.Fatalf("ListEvents(%+v) seqs = %v, want %v", tt.f, seqs(got), seqs(tt.want))
			}
			for i := range got {
				g, w := got[i], tt.want[i]
				if !g.Time.Equal(w.Time) || g.Time.Location() != time.UTC {
					t.Errorf("event %d: Time = %v, want %v (UTC)", w.Seq, g.Time, w.Time)
				}
				if g.RunID != w.RunID || g.Name != w.Name || g.RequestID != w.RequestID || !bytes.Equal(g.Payload, w.Payload) {
					t.Errorf("event read back:\n got %+v (payload %s)\nwant %+v (payload %s)", g, g.Payload, w, w.Payload)
				}
			}
		})
	}
	_, err := s.ListEvents(ctx, store.EventFilter{Limit: -1})
	wantErr(t, "ListEvents with a negative limit", err, errdefs.ErrInvalidArgument)
}

func testEventPayloadRoundTrip(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	r := newRun(t, "acme", "alice")
	mustCreate(t, s, r)
	payloads := map[string]any{
		events.NameSandboxSkipped:   events.SandboxSkipped{Mode: "auto", Source: "env", Obstacle: "docker: no such socket", FileSecretsDropped: true},
		events.NameSandboxEnvDenied: events.SandboxEnvDenied{Keys: []string{"LD_PRELOAD", "HTTPS_PROXY"}, Origin: "devcontainer.json"},
		events.NameExecFinished:     events.ExecFinished{ExitCode: -1, TimedOut: true, DurationMS: 1 << 40, Transport: "exec", Truncated: true},
		events.NameNetworkBlocked:   events.NetworkBlocked{Host: "ünïcødé.example \"quoted\" <tag> \\ \u2028", Port: 443, Rule: "!gist.github.com"},
	}
	for name, p := range payloads {
		e, err := events.New(r.ID, name, p)
		if err != nil {
			t.Fatal(err)
		}
		seq, err := s.AppendEvent(ctx, e)
		if err != nil {
			t.Fatalf("AppendEvent(%s): %v", name, err)
		}
		got, err := s.ListEvents(ctx, store.EventFilter{AfterSeq: seq - 1, Limit: 1})
		if err != nil || len(got) != 1 || got[0].Seq != seq {
			t.Fatalf("ListEvents after %d = %v, %v", seq-1, got, err)
		}
		if !bytes.Equal(got[0].Payload, e.Payload) {
			t.Errorf("%s payload = %s, want %s", name, got[0].Payload, e.Payload)
		}
		decoded, err := got[0].Decode()
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		if !reflect.DeepEqual(decoded, p) {
			t.Errorf("%s decoded = %#v, want %#v", name, decoded, p)
		}
	}

	// A payload the store is handed as raw JSON is kept as compact JSON; an empty one becomes {}.
	for raw, want := range map[string]string{
		"{ \"a\" : [1, 2,\n 3] }": `{"a":[1,2,3]}`,
		"":                        `{}`,
		`null`:                    `null`,
	} {
		seq, err := s.AppendEvent(ctx, store.Event{RunID: r.ID, Name: "custom", Payload: json.RawMessage(raw)})
		if err != nil {
			t.Fatalf("AppendEvent(%q): %v", raw, err)
		}
		got, err := s.ListEvents(ctx, store.EventFilter{AfterSeq: seq - 1, Limit: 1})
		if err != nil || len(got) != 1 {
			t.Fatalf("ListEvents: %v, %v", got, err)
		}
		if string(got[0].Payload) != want {
			t.Errorf("payload %q read back as %s, want %s", raw, got[0].Payload, want)
		}
		if !got[0].Time.After(time.Now().Add(-time.Minute)) {
			t.Errorf("zero Time read back as %v, want about now", got[0].Time)
		}
	}
}

func testEventInvalid(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	for _, e := range []store.Event{
		{Name: "", Payload: json.RawMessage(`{}`)},
		{Name: "x", Payload: json.RawMessage(`{not json`)},
	} {
		_, err := s.AppendEvent(ctx, e)
		wantErr(t, fmt.Sprintf("AppendEvent(%q, %s)", e.Name, e.Payload), err, errdefs.ErrInvalidArgument)
	}
	evs, err := s.ListEvents(ctx, store.EventFilter{})
	if err != nil || len(evs) != 0 {
		t.Errorf("ListEvents after invalid appends = %v, %v; want none", evs, err)
	}
}

// checkComplete checks that evs, listed in order, are exactly the events named by want (request ids), each
// once, with unique, strictly increasing seqs.
func checkComplete(t *testing.T, evs []store.Event, want map[string]bool) {
	t.Helper()
	if len(evs) != len(want) {
		t.Errorf("%d events, want %d", len(evs), len(want))
	}
	seen := map[string]bool{}
	for i, e := range evs {
		if i > 0 && e.Seq <= evs[i-1].Seq {
			t.Errorf("event %d has seq %d after %d: want strictly increasing", i, e.Seq, evs[i-1].Seq)
		}
		if !want[e.RequestID] || seen[e.RequestID] {
			t.Errorf("event %d: unexpected or repeated %q", e.Seq, e.RequestID)
		}
		seen[e.RequestID] = true
	}
	for id := range want {
		if !seen[id] {
			t.Errorf("event %q lost", id)
		}
	}
}

func testConcurrentAppend(t *testing.T, s store.Store) {
	const goroutines, perGoroutine = 8, 50
	ctx := ctxOf(t)
	r := newRun(t, "acme", "alice")
	mustCreate(t, s, r)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex // guards got
		got  = map[int64]string{}
		want = map[string]bool{}
		errs = make(chan error, goroutines*perGoroutine)
	)
	for g := range goroutines {
		for i := range perGoroutine {
			want[fmt.Sprintf("g%d-%d", g, i)] = true
		}
		wg.Go(func() {
			for i := range perGoroutine {
				e, err := events.New(r.ID, events.NameExecFinished, events.ExecFinished{ExitCode: i})
				if err != nil {
					errs <- err
					return
				}
				e.RequestID = fmt.Sprintf("g%d-%d", g, i)
				seq, err := s.AppendEvent(ctx, e)
				if err != nil {
					errs <- fmt.Errorf("%s: %w", e.RequestID, err)
					continue
				}
				mu.Lock()
				if prev, dup := got[seq]; dup {
					errs <- fmt.Errorf("seq %d given to %s and %s", seq, prev, e.RequestID)
				}
				got[seq] = e.RequestID
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	evs, err := s.ListEvents(ctx, store.EventFilter{RunID: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	checkComplete(t, evs, want)
	for _, e := range evs {
		if got[e.Seq] != e.RequestID {
			t.Errorf("event %d is %q, AppendEvent returned that seq for %q", e.Seq, e.RequestID, got[e.Seq])
		}
	}
}

// testConcurrentFinish races several finishes of one run: exactly one wins, the others see a finished run.
func testConcurrentFinish(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	r := newRun(t, "acme", "alice")
	mustCreate(t, s, r)
	const n = 8
	results := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			results[i] = s.UpdateRun(ctx, r.ID, store.RunUpdate{Status: store.StatusFailed, FailureCode: "C" + strconv.Itoa(i)})
		})
	}
	wg.Wait()
	winner := -1
	for i, err := range results {
		switch {
		case err == nil && winner >= 0:
			t.Errorf("finishes %d and %d both succeeded", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, errdefs.ErrFailedPrecondition):
			t.Errorf("finish %d: %v, want success or %v", i, err, errdefs.ErrFailedPrecondition)
		}
	}
	if winner < 0 {
		t.Fatal("no finish succeeded")
	}
	if got := mustGet(t, s, r.ID); got.FailureCode != "C"+strconv.Itoa(winner) {
		t.Errorf("FailureCode = %q, want the winner's C%d", got.FailureCode, winner)
	}
}

// testMultiProcess starts writer processes on one fresh store. They open it at the same time (racing the
// migrations), report ready, and on "go <run id>" each append eventsPerWriter events to that run; afterwards
// exactly writers*eventsPerWriter events exist, each once, with increasing seqs.
func testMultiProcess(t *testing.T, c config) {
	ctx := ctxOf(t)
	loc := c.location(t)
	top, _, _ := strings.Cut(t.Name(), "/")

	type child struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		stdout *bufio.Reader
		stderr bytes.Buffer
	}
	children := make([]*child, writers)
	for i := range children {
		ch := &child{}
		ch.cmd = exec.CommandContext(ctx, os.Args[0], "-test.run=^"+regexp.QuoteMeta(top)+"$", "-test.count=1")
		ch.cmd.Env = append(os.Environ(), envWriter+"="+strconv.Itoa(i), envLocation+"="+loc)
		ch.cmd.Stderr = &ch.stderr
		var err error
		if ch.stdin, err = ch.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		out, err := ch.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		ch.stdout = bufio.NewReader(out)
		if err := ch.cmd.Start(); err != nil {
			t.Fatalf("start writer %d: %v", i, err)
		}
		children[i] = ch
		t.Cleanup(func() { // on an early failure: make sure no writer outlives the test
			_ = ch.stdin.Close()
			_ = ch.cmd.Process.Kill()
		})
	}

	// The parent opens the store too, while the writers do.
	s, err := c.openAt(ctx, loc)
	if err != nil {
		t.Fatalf("open %s: %v", loc, err)
	}
	defer s.Close()
	r := newRun(t, "acme", "alice")
	mustCreate(t, s, r)

	var transcript []string // each writer's stdout before it was ready, for failure messages
	for i, ch := range children {
		var lines []string
		for {
			line, err := ch.stdout.ReadString('\n')
			line = strings.TrimSpace(line)
			if line == readyLine {
				break
			}
			lines = append(lines, line)
			if err != nil {
				_ = ch.cmd.Wait()
				t.Fatalf("writer %d never became ready: %v\nstdout:\n%s\nstderr:\n%s", i, err, strings.Join(lines, "\n"), ch.stderr.String())
			}
		}
		transcript = append(transcript, strings.Join(lines, "\n"))
	}
	for i, ch := range children {
		if _, err := fmt.Fprintf(ch.stdin, "go %s\n", r.ID); err != nil {
			t.Fatalf("start writer %d: %v", i, err)
		}
		_ = ch.stdin.Close()
	}
	for i, ch := range children {
		rest, _ := io.ReadAll(ch.stdout)
		if err := ch.cmd.Wait(); err != nil {
			t.Errorf("writer %d: %v\nstdout:\n%s%s\nstderr:\n%s", i, err, transcript[i], rest, ch.stderr.String())
		}
	}
	if t.Failed() {
		return
	}

	evs, err := s.ListEvents(ctx, store.EventFilter{RunID: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for w := range writers {
		for i := range eventsPerWriter {
			want[fmt.Sprintf("w%d-%d", w, i)] = true
		}
	}
	checkComplete(t, evs, want)
	// How often consecutive events come from different writers: evidence that the writers really overlapped.
	switches := 0
	for i := 1; i < len(evs); i++ {
		a, _, _ := strings.Cut(evs[i-1].RequestID, "-")
		b, _, _ := strings.Cut(evs[i].RequestID, "-")
		if a != b {
			switches++
		}
	}
	t.Logf("%d writer processes appended %d events; seqs %d..%d; writer changed %d times along seq order",
		writers, len(evs), evs[0].Seq, evs[len(evs)-1].Seq, switches)
}

// runWriter is the suite in a writer process: open the store, say ready, wait for the run id, append.
func runWriter(t *testing.T, c config) {
	if c.openAt == nil {
		t.Fatalf("%s is set but the suite has no storetest.MultiProcess option", envWriter)
	}
	w := os.Getenv(envWriter)
	ctx := ctxOf(t)
	s, err := c.openAt(ctx, os.Getenv(envLocation))
	if err != nil {
		t.Fatalf("writer %s: open: %v", w, err)
	}
	defer s.Close()
	fmt.Println(readyLine)
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		t.Fatalf("writer %s: read start line: %v", w, err)
	}
	runID, ok := strings.CutPrefix(strings.TrimSpace(line), "go ")
	if !ok {
		t.Fatalf("writer %s: start line %q", w, line)
	}
	for i := range eventsPerWriter {
		e, err := events.New(runID, events.NameExecFinished, events.ExecFinished{ExitCode: i, Transport: "w" + w})
		if err != nil {
			t.Fatal(err)
		}
		e.RequestID = fmt.Sprintf("w%s-%d", w, i)
		if _, err := s.AppendEvent(ctx, e); err != nil {
			t.Fatalf("writer %s: append %s: %v", w, e.RequestID, err)
		}
	}
}
