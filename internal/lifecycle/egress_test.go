package lifecycle

import (
	"fmt"
	"testing"

	"github.com/sandkeep/sandkeep/internal/events"
)

// TestBlockTally: a command refused thousands of times, at one host and at many, costs the store at most
// maxBlockKinds network_blocked events and one network_blocked_repeats, which counts every refusal left out.
func TestBlockTally(t *testing.T) {
	var writes []events.NetworkBlocked
	tally := newBlockTally(func(ev events.NetworkBlocked) { writes = append(writes, ev) })
	for range 5000 {
		tally.add(events.NetworkBlocked{Host: "denied.test", Port: 443, Reason: "not-allowlisted"})
	}
	for i := range 1000 {
		tally.add(events.NetworkBlocked{Host: fmt.Sprintf("h%d.test", i), Port: 443, Reason: "not-allowlisted"})
	}
	rep, ok := tally.flush()
	if !ok {
		t.Fatal("no repeats to report")
	}
	if len(writes) != maxBlockKinds {
		t.Errorf("%d network_blocked events written, want %d", len(writes), maxBlockKinds)
	}
	if writes[0].Host != "denied.test" {
		t.Errorf("the first refusal was not written at once: %+v", writes[0])
	}
	if len(rep.Repeats) != 1 || rep.Repeats[0].Host != "denied.test" || rep.Repeats[0].Count != 4999 {
		t.Errorf("repeats %+v, want denied.test 4999 times", rep.Repeats)
	}
	if rep.Dropped != 1000-(maxBlockKinds-1) {
		t.Errorf("dropped %d, want %d", rep.Dropped, 1000-(maxBlockKinds-1))
	}
	total := len(writes) + rep.Dropped
	for _, r := range rep.Repeats {
		total += r.Count
	}
	if total != 6000 {
		t.Errorf("the events account for %d refusals, want 6000", total)
	}
	if _, ok := tally.flush(); ok {
		t.Error("a second flush reported the same repeats again")
	}
}
