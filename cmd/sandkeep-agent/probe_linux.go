package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"
)

// The NetworkPolicy enforcement probe's client (the kubernetes driver's probe pod runs it). It only dials: the
// driver listens on the addresses and decides from what reaches it, never from what the pod says, so a probe
// that lies or dies proves nothing either way. Each address is dialled every probeEvery, with a short timeout,
// until the time is up; a connection is closed at once, nothing is sent. SECONDS 0 dials each address once,
// with a short timeout (a reachable host port answers within milliseconds): the driver's check that a new pod's
// policy has taken hold before its first command.
const (
	probeEvery       = 200 * time.Millisecond
	probeDialTimeout = time.Second
	probeOnceTimeout = 250 * time.Millisecond
	maxProbeSeconds  = 300
)

// probeNetBuiltin runs `sandkeep-agent probe-net SECONDS ADDR...`.
func probeNetBuiltin(args []string) (int, bool) {
	if len(args) == 0 || args[0] != "probe-net" {
		return 0, false
	}
	secs, addrs, err := parseProbeNet(args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandkeep-agent probe-net: %v\nusage: sandkeep-agent probe-net SECONDS IP:PORT...\n", err)
		return 2, true
	}
	deadline := time.Now().Add(time.Duration(secs) * time.Second)
	var wg sync.WaitGroup
	for _, a := range addrs {
		wg.Go(func() {
			if secs == 0 {
				if c, err := net.DialTimeout("tcp", a, probeOnceTimeout); err == nil {
					c.Close()
				}
				return
			}
			for time.Now().Before(deadline) {
				if c, err := net.DialTimeout("tcp", a, probeDialTimeout); err == nil {
					c.Close()
				}
				time.Sleep(probeEvery)
			}
		})
	}
	wg.Wait()
	return 0, true
}

// parseProbeNet reads SECONDS (0..300) and one or more IP:port addresses.
func parseProbeNet(args []string) (int, []string, error) {
	if len(args) < 2 {
		return 0, nil, fmt.Errorf("want SECONDS and at least one address, got %d arguments", len(args))
	}
	secs, err := strconv.Atoi(args[0])
	if err != nil || secs < 0 || secs > maxProbeSeconds {
		return 0, nil, fmt.Errorf("seconds %q is not in 0..%d", args[0], maxProbeSeconds)
	}
	for _, a := range args[1:] {
		if err := checkNetChannel(a); err != nil {
			return 0, nil, err
		}
	}
	return secs, args[1:], nil
}
