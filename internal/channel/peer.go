package channel

import (
	"log/slog"
	"sync"
	"time"
)

// The peer check must not let a sandbox drive the host: a process inside that dials the channel or egress socket in
// a loop would otherwise cost an engine call (to learn the sandbox's PID 1) and a log line per connection.
// Throttle answers from the cached PID and calls the engine at most once per interval; refusals are logged
// through a refusalLog, at most once per interval with a count of those left out.

// Throttle returns a Verifier that accepts pid when known says it is the sandbox's PID 1 as last seen (no engine
// call), and otherwise asks check (the engine) at most once per every, refusing without asking in between; a
// pid check refused is remembered (the last 64) and refused again without asking. A sandbox restarted with a new
// PID 1 is usually known before its agent dials (lifecycle caches it when it starts the sandbox); if not, its
// agent's retry within the interval is accepted.
func Throttle(known func(pid int) bool, check Verifier, every time.Duration) Verifier {
	t := &throttle{known: known, check: check, every: every, now: time.Now}
	return t.verify
}

type throttle struct {
	known func(pid int) bool
	check Verifier
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex // guards last and refused; held across check so checks never run in parallel
	last    time.Time  // when check was last called
	refused []int      // pids check refused, the newest last; at most 64
}

func (t *throttle) verify(pid int) bool {
	if pid <= 0 {
		return false
	}
	if t.known(pid) {
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.refused {
		if r == pid {
			return false
		}
	}
	now := t.now()
	if !t.last.IsZero() && now.Sub(t.last) < t.every {
		return false
	}
	t.last = now
	if t.check(pid) {
		return true
	}
	if len(t.refused) == 64 {
		t.refused = t.refused[1:]
	}
	t.refused = append(t.refused, pid)
	return false
}

// refusalLog logs refused connections at most once per interval, saying how many were left out since.
type refusalLog struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	last    time.Time
	skipped int
}

// logEvery is how often a listener logs refused connections at most.
const logEvery = 10 * time.Second

func newRefusalLog(log *slog.Logger) *refusalLog {
	return &refusalLog{log: log, every: logEvery, now: time.Now}
}

func (r *refusalLog) refused(msg string, args ...any) {
	r.mu.Lock()
	now := r.now()
	if !r.last.IsZero() && now.Sub(r.last) < r.every {
		r.skipped++
		r.mu.Unlock()
		return
	}
	skipped := r.skipped
	r.last, r.skipped = now, 0
	r.mu.Unlock()
	r.log.Warn(msg, append(args, "refused_since_last_log", skipped)...)
}
