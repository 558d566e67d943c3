package storetest

import (
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/store"
)

// testRunLogs: a run's log keeps its entries in order, with source, time and text as written (invalid UTF-8 and
// NUL made safe), separate from other runs'; AfterSeq and Limit page it; an unknown run is ErrNotFound, an unknown
// source or a missing run id ErrInvalidArgument.
func testRunLogs(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	a, b := newRun(t, "acme", "alice"), newRun(t, "acme", "bob")
	mustCreate(t, s, a)
	mustCreate(t, s, b)
	write := func(run, source, text string) int64 {
		t.Helper()
		seq, err := s.AppendRunLog(ctx, store.RunLog{RunID: run, Source: source, Text: text})
		if err != nil || seq <= 0 {
			t.Fatalf("AppendRunLog(%s, %s) = %d, %v", run, source, seq, err)
		}
		return seq
	}
	s1 := write(a.ID, store.LogDriver, "create sandkeep-u-1 from img")
	write(b.ID, store.LogBuild, "step 1/2 (other run)")
	s2 := write(a.ID, store.LogBuild, "Step 1/2 : FROM scratch\n")
	s3 := write(a.ID, store.LogPostCreate, "bad \xff byte and nul \x00 here")
	if !(s1 < s2 && s2 < s3) {
		t.Errorf("seqs %d %d %d do not increase", s1, s2, s3)
	}
	got, err := s.ListRunLogs(ctx, store.RunLogFilter{RunID: a.ID})
	if err != nil || len(got) != 3 {
		t.Fatalf("ListRunLogs = %+v, %v; want 3 entries", got, err)
	}
	want := []struct{ source, text string }{{store.LogDriver, "create sandkeep-u-1 from img"},
		{store.LogBuild, "Step 1/2 : FROM scratch\n"}, {store.LogPostCreate, "bad \uFFFD byte and nul  here"}}
	for i, w := range want {
		if g := got[i]; g.RunID != a.ID || g.Source != w.source || g.Text != w.text || g.Time.IsZero() || g.Time.Location().String() != "UTC" {
			t.Errorf("entry %d = %+v, want %s %q", i, g, w.source, w.text)
		}
	}
	page, err := s.ListRunLogs(ctx, store.RunLogFilter{RunID: a.ID, AfterSeq: s1, Limit: 1})
	if err != nil || len(page) != 1 || page[0].Seq != s2 {
		t.Errorf("after %d, limit 1: %+v, %v; want seq %d", s1, page, err, s2)
	}
	if _, err := s.AppendRunLog(ctx, store.RunLog{RunID: "0190c4f0-0000-7000-8000-000000000000", Source: store.LogDriver, Text: "x"}); !errdefs.IsNotFound(err) {
		t.Errorf("append to no run: %v, want NotFound", err)
	}
	if _, err := s.AppendRunLog(ctx, store.RunLog{RunID: a.ID, Source: "stdout", Text: "x"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("unknown source: %v, want InvalidArgument", err)
	}
	if _, err := s.ListRunLogs(ctx, store.RunLogFilter{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no run id: %v, want InvalidArgument", err)
	}

	// Enqueued lines (the driver's line of every command) keep their order among synchronous ones, are read at
	// once by this process (ListRunLogs flushes), and report their seq or error to done.
	c := newRun(t, "acme", "carol")
	mustCreate(t, s, c)
	seqs := make(chan int64, 2)
	s.EnqueueRunLog(store.RunLog{RunID: c.ID, Source: store.LogDriver, Text: "reuse sandbox"}, func(seq int64, err error) {
		if err != nil {
			t.Errorf("enqueued run log: %v", err)
		}
		seqs <- seq
	})
	after := write(c.ID, store.LogPostAttach, "attached")
	s.EnqueueRunLog(store.RunLog{RunID: c.ID, Source: store.LogDriver, Text: "last"}, nil)
	got, err = s.ListRunLogs(ctx, store.RunLogFilter{RunID: c.ID})
	if err != nil || len(got) != 3 || got[0].Text != "reuse sandbox" || got[1].Seq != after || got[2].Text != "last" {
		t.Fatalf("after enqueued appends: %+v, %v; want reuse sandbox, attached (seq %d), last", got, err, after)
	}
	if first := <-seqs; first != got[0].Seq {
		t.Errorf("done got seq %d, the entry has %d", first, got[0].Seq)
	}
	notFound := make(chan error, 1)
	s.EnqueueRunLog(store.RunLog{RunID: "0190c4f0-0000-7000-8000-000000000000", Source: store.LogDriver, Text: "x"},
		func(_ int64, err error) { notFound <- err })
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-notFound; !errdefs.IsNotFound(err) {
		t.Errorf("enqueued append to no run: %v, want NotFound", err)
	}
}

// testRunLogBound: concurrent appenders to one run together keep at most store.RunLogLimit bytes of text: the
// entry that passes the bound is cut (on a rune boundary) and followed by exactly one truncation entry, and
// later entries are dropped (seq 0, no error). Another run's log is not affected.
func testRunLogBound(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	r, other := newRun(t, "acme", "big"), newRun(t, "acme", "small")
	mustCreate(t, s, r)
	mustCreate(t, s, other)
	chunk := strings.Repeat("é", 20<<10) // 40 KiB of two-byte runes: the cut must fall between them
	const writers, each = 4, 8           // 32 x 40 KiB = 1.25 MiB offered
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for range writers {
		wg.Go(func() {
			for range each {
				if _, err := s.AppendRunLog(ctx, store.RunLog{RunID: r.ID, Source: store.LogBuild, Text: chunk}); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("AppendRunLog: %v", err)
	}
	if seq, err := s.AppendRunLog(ctx, store.RunLog{RunID: r.ID, Source: store.LogDriver, Text: "after the bound"}); err != nil || seq != 0 {
		t.Errorf("append past the bound = %d, %v; want 0 (dropped), nil", seq, err)
	}
	got, err := s.ListRunLogs(ctx, store.RunLogFilter{RunID: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	var total, markers int
	for i, l := range got {
		if l.Source == store.LogTruncated {
			markers++
			if i != len(got)-1 {
				t.Errorf("the truncation entry is %d of %d, want last", i, len(got))
			}
			continue
		}
		if !utf8.ValidString(l.Text) {
			t.Errorf("entry %d was cut inside a rune", l.Seq)
		}
		total += len(l.Text)
	}
	if markers != 1 || total > store.RunLogLimit || total < store.RunLogLimit-1 {
		t.Errorf("kept %d bytes with %d truncation entries; want %d (or one less for a rune) and exactly one", total, markers, store.RunLogLimit)
	}
	if seq, err := s.AppendRunLog(ctx, store.RunLog{RunID: other.ID, Source: store.LogDriver, Text: "fine"}); err != nil || seq <= 0 {
		t.Errorf("another run's append = %d, %v", seq, err)
	}
}
