package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
)

// testQueryRuns: every filter of a run query, and pages that cover the list exactly once even where runs share
// a creation time.
func testQueryRuns(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	type spec struct {
		tenant, user, status, code, mode, driver string
		at                                       time.Duration
	}
	specs := []spec{
		{"t1", "alice", store.StatusRunning, "", "auto", "docker", 1 * time.Millisecond},
		{"t1", "bob", store.StatusSucceeded, "", "inline", "docker", 2 * time.Millisecond},
		{"t2", "alice", store.StatusFailed, "SANDBOX_DRIVER_UNAVAILABLE", "inline", "", 3 * time.Millisecond},
		{"t1", "alice", store.StatusFailed, "EXEC_TIMEOUT", "auto", "host", 4 * time.Second},
		{"t1", "alice", store.StatusSucceeded, "", "auto", "docker", 5 * time.Hour},
		{"t1", "carol", store.StatusSucceeded, "", "auto", "docker", 5 * time.Hour}, // ties: the id orders them
		{"t1", "dave", store.StatusSucceeded, "", "auto", "docker", 5 * time.Hour},
	}
	all := make([]store.Run, len(specs))
	for i, sp := range specs {
		r := newRun(t, sp.tenant, sp.user)
		r.CreatedAt, r.Status, r.ResolvedMode, r.Driver = base.Add(sp.at), sp.status, sp.mode, sp.driver
		if sp.code != "" {
			r.FailureCode, r.Disposition = sp.code, store.DispositionDeterministic
		}
		if sp.driver == "" {
			r.Admission = store.AdmissionRefused
		}
		mustCreate(t, s, r)
		all[i] = mustGet(t, s, r.ID)
	}
	pick := func(idx ...int) []string {
		var out []string
		for _, i := range idx {
			out = append(out, all[i].ID)
		}
		return out
	}
	tests := []struct {
		name string
		q    store.RunQuery
		want []string
	}{
		{"all newest first", store.RunQuery{}, pick(6, 5, 4, 3, 2, 1, 0)},
		{"tenant", store.RunQuery{Tenant: "t2"}, pick(2)},
		{"user", store.RunQuery{User: "alice"}, pick(4, 3, 2, 0)},
		{"status", store.RunQuery{Status: store.StatusFailed}, pick(3, 2)},
		{"failure code", store.RunQuery{FailureCode: "EXEC_TIMEOUT"}, pick(3)},
		{"mode", store.RunQuery{Mode: "inline"}, pick(2, 1)},
		{"driver", store.RunQuery{Driver: "host"}, pick(3)},
		{"refused", store.RunQuery{Admission: store.AdmissionRefused}, pick(2)},
		{"together", store.RunQuery{Tenant: "t1", User: "alice", Mode: "auto", Driver: "docker"}, pick(4, 0)},
		{"after a tie", store.RunQuery{After: store.Cursor{CreatedAt: all[5].CreatedAt, ID: all[5].ID}}, pick(4, 3, 2, 1, 0)},
		{"no match", store.RunQuery{Tenant: "t3"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page, err := s.QueryRuns(ctx, tt.q)
			if err != nil {
				t.Fatalf("QueryRuns(%+v): %v", tt.q, err)
			}
			if !slices.Equal(ids(page.Runs), tt.want) || page.More {
				t.Errorf("QueryRuns(%+v) = %v (more %v), want %v", tt.q, ids(page.Runs), page.More, tt.want)
			}
		})
	}
	// Pages of two: every run once, in order, and More on every page but the last.
	var got []string
	q := store.RunQuery{Limit: 2}
	for pages := 0; ; pages++ {
		if pages > len(all) {
			t.Fatal("paging does not end")
		}
		page, err := s.QueryRuns(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ids(page.Runs)...)
		if !page.More {
			break
		}
		last := page.Runs[len(page.Runs)-1]
		q.After = store.Cursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	if want := pick(6, 5, 4, 3, 2, 1, 0); !slices.Equal(got, want) {
		t.Errorf("paged = %v, want %v", got, want)
	}
	page, err := s.QueryRuns(ctx, store.RunQuery{Tenant: "t1", Limit: 1})
	if err != nil || len(page.Runs) != 1 {
		t.Fatalf("QueryRuns limit 1: %v, %v", page, err)
	}
	sameRun(t, page.Runs[0], all[6])
	_, err = s.QueryRuns(ctx, store.RunQuery{Limit: -1})
	wantErr(t, "QueryRuns with a negative limit", err, errdefs.ErrInvalidArgument)
	_, err = s.QueryRuns(ctx, store.RunQuery{Status: "bogus"})
	wantErr(t, "QueryRuns with an unknown status", err, errdefs.ErrInvalidArgument)

	counts, err := s.CountRuns(ctx, "t1", time.Time{})
	if want := (store.RunCounts{Total: 6, Running: 1, Succeeded: 4, Failed: 1}); err != nil || counts != want {
		t.Errorf("CountRuns(t1) = %+v, %v; want %+v", counts, err, want)
	}
	counts, err = s.CountRuns(ctx, "", time.Time{})
	if want := (store.RunCounts{Total: 7, Running: 1, Succeeded: 4, Failed: 2, Refused: 1}); err != nil || counts != want {
		t.Errorf("CountRuns(all) = %+v, %v; want %+v", counts, err, want)
	}
	counts, err = s.CountRuns(ctx, "", base.Add(4*time.Second))
	if want := (store.RunCounts{Total: 4, Succeeded: 3, Failed: 1}); err != nil || counts != want {
		t.Errorf("CountRuns(since) = %+v, %v; want %+v", counts, err, want)
	}
}

// testEventAggregates: refused hosts grouped and counted over a window, recent events by name, both scoped to a
// tenant's runs.
func testEventAggregates(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	a, b := newRun(t, "acme", "alice"), newRun(t, "globex", "bob")
	mustCreate(t, s, a)
	mustCreate(t, s, b)
	base := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	var seqs []int64
	add := func(runID, name string, at time.Duration, payload any) {
		t.Helper()
		e, err := events.New(runID, name, payload)
		if err != nil {
			t.Fatal(err)
		}
		e.Time = base.Add(at)
		seq, err := s.AppendEvent(ctx, e)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seq)
	}
	blocked := func(host, reason, rule, sandbox string) events.NetworkBlocked {
		return events.NetworkBlocked{Host: host, Port: 443, Reason: reason, Rule: rule, Sandbox: sandbox}
	}
	add(a.ID, events.NameNetworkBlocked, 0, blocked("evil.test", "not-allowlisted", "", "sb-a"))                 // 0
	add(a.ID, events.NameNetworkBlocked, time.Minute, blocked("evil.test", "not-allowlisted", "", "sb-a2"))      // 1
	add(a.ID, events.NameExecFinished, 2*time.Minute, events.ExecFinished{DurationMS: 12})                       // 2
	add(a.ID, events.NameNetworkBlocked, 3*time.Minute, blocked("gist.test", "denied-by-rule", "!gist", "sb-a")) // 3
	add(b.ID, events.NameNetworkBlocked, 4*time.Minute, blocked("evil.test", "not-allowlisted", "", "sb-b"))     // 4
	add("", events.NameNetworkBlocked, 5*time.Minute, blocked("metadata.test", "metadata", "", "sb-x"))          // 5
	add(a.ID, events.NameNetworkBlocked, 6*time.Minute, blocked("evil.test", "not-allowlisted", "", "sb-a"))     // 6

	hosts, err := s.RefusedHosts(ctx, store.EventQuery{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	want := []store.RefusedHost{
		{Host: "evil.test", Port: 443, Reason: "not-allowlisted", Count: 3, Sandboxes: 2, Last: base.Add(6 * time.Minute)},
		{Host: "gist.test", Port: 443, Reason: "denied-by-rule", Rule: "!gist", Count: 1, Sandboxes: 1, Last: base.Add(3 * time.Minute)},
	}
	if !slices.EqualFunc(hosts, want, sameRefused) {
		t.Errorf("RefusedHosts(acme) = %+v\nwant %+v", hosts, want)
	}
	hosts, err = s.RefusedHosts(ctx, store.EventQuery{Tenant: "acme", Since: base.Add(2 * time.Minute)})
	want = []store.RefusedHost{
		{Host: "evil.test", Port: 443, Reason: "not-allowlisted", Count: 1, Sandboxes: 1, Last: base.Add(6 * time.Minute)},
		{Host: "gist.test", Port: 443, Reason: "denied-by-rule", Rule: "!gist", Count: 1, Sandboxes: 1, Last: base.Add(3 * time.Minute)},
	}
	if err != nil || !slices.EqualFunc(hosts, want, sameRefused) {
		t.Errorf("RefusedHosts(acme, since) = %+v, %v\nwant %+v", hosts, err, want)
	}
	hosts, err = s.RefusedHosts(ctx, store.EventQuery{Tenant: "globex"})
	if err != nil || len(hosts) != 1 || hosts[0].Host != "evil.test" || hosts[0].Count != 1 {
		t.Errorf("RefusedHosts(globex) = %+v, %v: want its one refusal only", hosts, err)
	}
	hosts, err = s.RefusedHosts(ctx, store.EventQuery{Limit: 2})
	if err != nil || len(hosts) != 2 || hosts[0].Count != 4 || hosts[0].Sandboxes != 3 {
		t.Errorf("RefusedHosts(all, limit 2) = %+v, %v", hosts, err)
	}
	hosts, err = s.RefusedHosts(ctx, store.EventQuery{Tenant: "acme", Newest: 2}) // events 6 and 3 only
	want = []store.RefusedHost{
		{Host: "evil.test", Port: 443, Reason: "not-allowlisted", Count: 1, Sandboxes: 1, Last: base.Add(6 * time.Minute)},
		{Host: "gist.test", Port: 443, Reason: "denied-by-rule", Rule: "!gist", Count: 1, Sandboxes: 1, Last: base.Add(3 * time.Minute)},
	}
	if err != nil || !slices.EqualFunc(hosts, want, sameRefused) {
		t.Errorf("RefusedHosts(acme, newest 2) = %+v, %v\nwant %+v", hosts, err, want)
	}
	hosts, err = s.RefusedHosts(ctx, store.EventQuery{Tenant: "initech"})
	if err != nil || len(hosts) != 0 {
		t.Errorf("RefusedHosts(a tenant with no runs) = %+v, %v", hosts, err)
	}

	recent, err := s.RecentEvents(ctx, store.EventQuery{Tenant: "acme", Names: []string{events.NameNetworkBlocked}, Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := runEventSeqs(recent); !slices.Equal(got, []int64{seqs[6], seqs[3], seqs[1]}) {
		t.Errorf("RecentEvents(acme, blocked, 3) seqs = %v", got)
	}
	for _, e := range recent {
		if e.Tenant != "acme" || e.User != "alice" || e.RunID != a.ID || e.Time.Location() != time.UTC {
			t.Errorf("RecentEvents: event %d has run %q of %q/%q, time %v", e.Seq, e.RunID, e.Tenant, e.User, e.Time)
		}
	}
	recent, err = s.RecentEvents(ctx, store.EventQuery{Names: []string{events.NameNetworkBlocked, events.NameExecFinished}, Since: base.Add(2 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if got := runEventSeqs(recent); !slices.Equal(got, []int64{seqs[6], seqs[5], seqs[4], seqs[3], seqs[2]}) {
		t.Errorf("RecentEvents(all, since) seqs = %v", got)
	}
	if e := recent[1]; e.RunID != "" || e.Tenant != "" || string(e.Payload) == "" {
		t.Errorf("an event of no run: %+v", e)
	}
	c := newRun(t, "acme", "carol")
	mustCreate(t, s, c)
	add(c.ID, events.NameNetworkBlocked, 7*time.Minute, blocked("evil.test", "not-allowlisted", "", "sb-c"))
	recent, err = s.RecentEvents(ctx, store.EventQuery{Tenant: "acme", User: "alice", Names: []string{events.NameNetworkBlocked}, Limit: 1})
	if err != nil || !slices.Equal(runEventSeqs(recent), []int64{seqs[6]}) {
		t.Errorf("RecentEvents(acme, alice) = %v, %v: want alice's newest only", runEventSeqs(recent), err)
	}
	recent, err = s.RecentEvents(ctx, store.EventQuery{RunIDs: []string{b.ID, c.ID}})
	if err != nil || !slices.Equal(runEventSeqs(recent), []int64{seqs[7], seqs[4]}) {
		t.Errorf("RecentEvents(runs b, c) = %v, %v", runEventSeqs(recent), err)
	}
	recent, err = s.RecentEvents(ctx, store.EventQuery{Tenant: "acme", RunIDs: []string{b.ID}})
	if err != nil || len(recent) != 0 {
		t.Errorf("RecentEvents(acme, globex's run) = %v, %v: want none", runEventSeqs(recent), err)
	}
	_, err = s.RecentEvents(ctx, store.EventQuery{User: "alice"})
	wantErr(t, "RecentEvents with a user and no tenant", err, errdefs.ErrInvalidArgument)
	recent, err = s.RecentEvents(ctx, store.EventQuery{Tenant: "globex"})
	if err != nil || !slices.Equal(runEventSeqs(recent), []int64{seqs[4]}) {
		t.Errorf("RecentEvents(globex) = %v, %v", runEventSeqs(recent), err)
	}
	_, err = s.RefusedHosts(ctx, store.EventQuery{Limit: -1})
	wantErr(t, "RefusedHosts with a negative limit", err, errdefs.ErrInvalidArgument)
	_, err = s.RecentEvents(ctx, store.EventQuery{Names: []string{""}})
	wantErr(t, "RecentEvents with an empty name", err, errdefs.ErrInvalidArgument)
}

func sameRefused(a, b store.RefusedHost) bool {
	return a.Host == b.Host && a.Port == b.Port && a.Reason == b.Reason && a.Rule == b.Rule && a.Count == b.Count &&
		a.Sandboxes == b.Sandboxes && a.Last.Equal(b.Last) && a.Last.Location() == time.UTC
}

func runEventSeqs(evs []store.RunEvent) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = e.Seq
	}
	return out
}
