package kube_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/reaper"
)

// TestChannelFollowsOwner: the replica that made a pod goes away (its driver closes: the agent's connection
// ends and its address refuses), and another replica, on another channel address, takes the pod on. Until it
// announces itself the pod's agent dials the dead address; once AnnounceChannel told it, the next command goes
// over the new replica's channel at once, and the reaper sees the pod rely on the new address's channel policy,
// no longer on the old one's.
func TestChannelFollowsOwner(t *testing.T) {
	c := theNode(t)
	ns := c.namespace(t)
	first := c.driver(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	key, err := identity.New("acme", "follow")
	if err != nil {
		t.Fatal(err)
	}
	sb := createStarted(t, ctx, first, c.spec(t, ns, key, "inst-follow-"+randHex(t, 3)))
	if r, via := runVia(t, ctx, first, sb, "sh", "-c", "echo kept > state.txt"); r.exit != 0 || !via {
		t.Fatalf("write: %+v (over the channel: %v)", r, via)
	}
	oldAddr := first.ChannelAddr()
	if err := first.Close(); err != nil { // the replica dies: its listener and the pod's connection go
		t.Fatal(err)
	}

	second := c.driver(t, ns) // another replica: its own channel address
	if second.ChannelAddr() == oldAddr {
		t.Fatalf("both drivers listen on %s", oldAddr)
	}
	second.AgentChannel(sb) // its pod informer runs, as a replica's would
	time.Sleep(time.Second) // the agent keeps dialling the dead address (its backoff at its longest)
	if st := second.ChannelStats(); st.Accepted != 0 {
		t.Fatalf("the pod's agent dialled the new replica before it was told: %+v", st)
	}

	began := time.Now()
	told, err := second.AnnounceChannel(ctx, sb)
	if err != nil || !told {
		t.Fatalf("AnnounceChannel = %v, %v; want the agent told", told, err)
	}
	announced := time.Since(began)
	r, via := runVia(t, ctx, second, sb, "cat", "state.txt")
	if r.stdout != "kept\n" || !via {
		t.Fatalf("after the announcement: %+v (over the channel: %v); want kept, over the new replica's channel", r, via)
	}
	t.Logf("announce (policy, exec, record): %v; announce to the first command's answer over the channel: %v",
		announced.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	if again, err := second.AnnounceChannel(ctx, sb); err != nil || again {
		t.Errorf("a second AnnounceChannel = %v, %v; want nothing to do (the agent dials this replica)", again, err)
	}

	// The reaper: the pod relies on the new address's policy, not the old one's.
	res, err := kube.ReapSource{API: c.api, Namespace: ns, PolicyGrace: -1}.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]string{}
	for _, x := range res {
		if x.Kind == kube.KindPolicy {
			held[x.Name] = x.Hold
		}
	}
	if h := held[kube.ChannelPolicyPrefix+policySuffix(t, ctx, c.k, ns, second.ChannelAddr())]; h != reaper.ReasonInUse {
		t.Errorf("the new replica's channel policy is held for %q; want %q (the pod dials it)", h, reaper.ReasonInUse)
	}
	if h := held[kube.ChannelPolicyPrefix+policySuffix(t, ctx, c.k, ns, oldAddr)]; h != "" {
		t.Errorf("the dead replica's channel policy is held for %q; want nothing (no pod dials it)", h)
	}
}
