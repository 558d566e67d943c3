package main

import (
	"sync"
	"syscall"
)

// reaper is the only place `serve` waits for processes: one goroutine collects every child (the commands it
// runs itself, the orphans they leave to it as a subreaper, and the supervisors of concurrent commands and
// processes) and passes each registered child's status to whoever started it. A command can no longer simply
// wait until wait4 finds no child at all: a supervisor lives beside it for as long as its process does.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus // registered pids; each channel has room for the one status
	gen     uint64                          // bumped by every start: an ECHILD from before it proves nothing
	idle    bool                            // wait4 found no child at all, and nothing was started since
	changed chan struct{}                   // closed and replaced after every reap and when idle is set
	kick    chan struct{}                   // room for one: a child was started while the loop slept
}

func newReaper() *reaper {
	r := &reaper{waiters: map[int]chan syscall.WaitStatus{}, idle: true, changed: make(chan struct{}), kick: make(chan struct{}, 1)}
	go r.loop() // for the life of the process: serve ends with os.Exit
	return r
}

// start runs spawn (which starts one child and returns its pid) so that the child's status is sure to reach the
// returned channel, however soon it exits.
func (r *reaper) start(spawn func() (int, error)) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := spawn()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = ch
	r.gen++
	r.idle = false
	select {
	case r.kick <- struct{}{}:
	default:
	}
	return pid, ch, nil
}

// state reports whether no child is left, and a channel closed at the next change.
func (r *reaper) state() (idle bool, changed <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.idle, r.changed
}

func (r *reaper) loop() {
	for {
		r.mu.Lock()
		gen := r.gen
		r.mu.Unlock()
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		r.mu.Lock()
		if err != nil { // ECHILD: no child, hence no descendant, is left
			if r.gen == gen {
				r.idle = true
				r.broadcast()
			}
			r.mu.Unlock()
			<-r.kick
			continue
		}
		if ch, ok := r.waiters[pid]; ok {
			ch <- ws
			delete(r.waiters, pid)
		}
		r.broadcast()
		r.mu.Unlock()
	}
}

func (r *reaper) broadcast() {
	close(r.changed)
	r.changed = make(chan struct{})
}
