package store

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// RunLog is one entry of a run's log: what the driver did for the run (create, start, recreate, and the engine's
// answers) and what each setup step printed (an image build, a feature install, post-create, post-start,
// postAttach). A command's own output is not here: it goes to its caller. Seq orders one run's entries.
type RunLog struct {
	Seq    int64     `json:"seq"`
	RunID  string    `json:"run_id"`
	Time   time.Time `json:"time"`
	Source string    `json:"source"` // one of the LogSource constants
	Text   string    `json:"text"`
}

// Sources of run log entries (RunLog.Source).
const (
	LogDriver     = "driver"      // the driver's actions for the run and the engine's answers
	LogBuild      = "build"       // an image build's output
	LogFeatures   = "features"    // devcontainer features' install output
	LogPostCreate = "post_create" // post_create's output
	LogPostStart  = "post_start"  // postStartCommand's output
	LogPostAttach = "post_attach" // postAttachCommand's output
	LogTruncated  = "truncated"   // the one entry saying the run's log reached RunLogLimit
)

// RunLogLimit bounds one run's log: the bytes of text it keeps. The entry that would pass it is cut at the limit
// and followed by one LogTruncated entry; later entries are dropped. A long build cannot fill the database.
const RunLogLimit = 1 << 20

// RunLogFilter selects one run's log entries.
type RunLogFilter struct {
	RunID    string // required
	AfterSeq int64  // only entries with Seq > AfterSeq
	Limit    int    // at most this many; 0 means no limit
}

// RunLogStore keeps runs' logs. Implemented by every Store (sqlite, postgres); storetest checks it.
type RunLogStore interface {
	// AppendRunLog adds l to run l.RunID's log (ErrNotFound for no such run), within RunLogLimit: it returns the
	// entry's sequence number, or 0 when the log was full and l was dropped. A zero l.Time is now. Appends to one
	// run are serialized, so a reader polling with AfterSeq misses none.
	AppendRunLog(ctx context.Context, l RunLog) (int64, error)
	// EnqueueRunLog appends l as AppendRunLog does, without waiting for it: it is committed with the writes
	// around it (Store.EnqueueEvent), in the order of the calls, and then done (when not nil; it must not block)
	// is called with the entry's sequence number or error. It is how the driver's lines reach a run's log without
	// a transaction each on the command's path.
	EnqueueRunLog(l RunLog, done func(seq int64, err error))
	// ListRunLogs returns the entries of f.RunID in ascending sequence order, after a Flush (a process reads what
	// it wrote).
	ListRunLogs(ctx context.Context, f RunLogFilter) ([]RunLog, error)
}

// PrepareRunLog validates l and fills its time. Implementations call it in AppendRunLog.
func PrepareRunLog(l RunLog) (RunLog, error) {
	if l.RunID == "" {
		return l, invalid("append run log: empty run id")
	}
	switch l.Source {
	case LogDriver, LogBuild, LogFeatures, LogPostCreate, LogPostStart, LogPostAttach, LogTruncated:
	default:
		return l, invalid("append run log %s: unknown source %q", l.RunID, l.Source)
	}
	if l.Time.IsZero() {
		l.Time = time.Now()
	}
	l.Time = l.Time.UTC().Truncate(time.Millisecond)
	l.Text = strings.ToValidUTF8(l.Text, "\uFFFD")
	l.Text = strings.ReplaceAll(l.Text, "\x00", "") // PostgreSQL's text has no NUL
	return l, nil
}

// FitRunLog is what of l a run whose log holds used bytes keeps: l itself, l cut at RunLogLimit (on a rune
// boundary) followed by the truncation marker, or nothing (the marker was written before). Implementations call
// it inside the transaction that read used and truncated.
func FitRunLog(l RunLog, used int64, truncated bool) []RunLog {
	if truncated {
		return nil
	}
	room := RunLogLimit - used
	if int64(len(l.Text)) <= room {
		return []RunLog{l}
	}
	cut := l.Text[:max(room, 0)]
	for len(cut) > 0 && !utf8.ValidString(cut) {
		cut = cut[:len(cut)-1]
	}
	marker := RunLog{RunID: l.RunID, Time: l.Time, Source: LogTruncated,
		Text: fmt.Sprintf("the run's log reached its bound of %d bytes; later output is not kept", RunLogLimit)}
	if cut == "" {
		return []RunLog{marker}
	}
	l.Text = cut
	return []RunLog{l, marker}
}

// CheckRunLogFilter refuses a filter without a run (ErrInvalidArgument). Implementations call it in ListRunLogs.
func CheckRunLogFilter(f RunLogFilter) error {
	if f.RunID == "" {
		return invalid("list run logs: empty run id")
	}
	if f.AfterSeq < 0 || f.Limit < 0 {
		return invalid("list run logs %s: negative after or limit", f.RunID)
	}
	return nil
}
