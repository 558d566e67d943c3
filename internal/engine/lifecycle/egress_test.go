package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
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

// unprovenNone is a driver whose network none is not proven (the kubernetes driver where NetworkPolicy is not
// enforced): driver.NoNetworkChecker refuses.
type unprovenNone struct {
	*fake.Driver
	checks atomic.Int32
	ok     bool
}

func (d *unprovenNone) CheckNoNetwork(_ context.Context, sb *driver.Sandbox) error {
	d.checks.Add(1)
	if d.ok {
		return nil
	}
	return fault.New(fault.NetworkUnenforced, "install an enforcing plugin", "network none is not proven for %s", sb.Name)
}

// TestNoneBlockChecked: a command whose block asks for network none is refused, and does not run, where the
// driver cannot prove none holds (NETWORK_UNENFORCED, the driver's hint); the same command without a block runs
// (doctor warns of it), and so does the block where the driver proves it.
func TestNoneBlockChecked(t *testing.T) {
	e := newEnv(t)
	drv := &unprovenNone{Driver: e.drv}
	m := e.managerOn(drv)
	k := key(t, "acme", "none")
	marker := filepath.Join(t.TempDir(), "ran")
	none := &egress.Policy{Mode: egress.ModeNone}

	req, _ := sh("touch " + marker)
	req.Network, req.NetworkBlock = none, true
	_, err := m.Exec(t.Context(), k, req)
	var fe *fault.Error
	if !errors.As(err, &fe) || fe.Code != fault.NetworkUnenforced || fe.Hint == "" {
		t.Fatalf("network none named where it is not proven: %v; want %s with a hint", err, fault.NetworkUnenforced)
	}
	if exists(marker) {
		t.Fatal("the refused command ran")
	}
	req.NetworkBlock = false // the default none: no block named
	if res, err := m.Exec(t.Context(), k, req); err != nil || res.ExitCode != 0 || !exists(marker) {
		t.Fatalf("a command without a block: %+v, %v", res, err)
	}
	if n := drv.checks.Load(); n != 1 {
		t.Errorf("CheckNoNetwork called %d times, want once (for the block only)", n)
	}
	drv.ok = true
	req.NetworkBlock = true
	if res, err := m.Exec(t.Context(), k, req); err != nil || res.ExitCode != 0 {
		t.Fatalf("network none named where it is proven: %+v, %v", res, err)
	}
}
