package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/reaper"
	"github.com/sandkeep/sandkeep/internal/store"
)

// The fleet's ways of choosing the reaping replica (fleet.leader).
const (
	leaderStore      = "store"
	leaderKubernetes = "kubernetes"
)

// ReaperLease is the coordination.k8s.io Lease, in the sandbox namespace, whose holder reaps (fleet.leader:
// kubernetes). The Role of deploy/kubernetes/rbac.yaml lets sandkeep get, create and update it.
const ReaperLease = "sandkeep-reaper"

// The leader election's timing: client-go's usual values. A dead leader is replaced within leaseDuration; a
// leader that cannot renew for renewDeadline stops reaping (its ctx ends) before another may start.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

// reapKube reaps the sandbox namespace (pods, records, claims, NetworkPolicies: kube.ReapSource) while this replica holds ReaperLease,
// through client-go's leader election, until ctx ends; the lease is released then (ReleaseOnCancel), so the next
// replica leads at once.
func (f *fleetSetup) reapKube(ctx context.Context, st store.Store, every time.Duration, log io.Writer) {
	logger := slog.New(slog.NewTextHandler(log, nil))
	cfg, err := kube.LoadConfig("")
	if err != nil {
		fmt.Fprintf(log, "sandkeep: fleet: no reaper: %v\n", err)
		return
	}
	api, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(log, "sandkeep: fleet: no reaper: %v\n", err)
		return
	}
	ns := cmp.Or(os.Getenv(kube.EnvNamespace), kube.DefaultNamespace)
	r := reaper.New(reaper.Config{Installation: f.cfg.Installation, Source: kube.ReapSource{API: api, Namespace: ns},
		Store: st, Logger: logger, Owner: f.reaperOwner()})
	lock := &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Name: ReaperLease, Namespace: ns},
		Client: api.CoordinationV1(), LockConfig: resourcelock.ResourceLockConfig{Identity: f.replica.ID()}}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, Name: ReaperLease, ReleaseOnCancel: true,
			LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					logger.Info("reaper: leading", "owner", f.replica.ID(), "lease", ns+"/"+ReaperLease)
					r.RunPasses(lctx, every)
				},
				OnStoppedLeading: func() { logger.Info("reaper: not leading", "owner", f.replica.ID()) },
			},
		})
		if err != nil {
			fmt.Fprintf(log, "sandkeep: fleet: no reaper: %v\n", err)
			return
		}
		le.Run(ctx) // returns when the lead is lost (or ctx ends): stand for it again
	}
}
