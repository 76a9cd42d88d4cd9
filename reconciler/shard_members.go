package reconciler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// staleLeaseDurations is how many lease durations past its expiry the
// membership Lease of a replica that died (and so never deleted it) stays
// before the other replicas delete it.
const staleLeaseDurations = 10

// shutdownWait bounds how long a stopping replica waits for its
// reconciles in progress before it releases their claims anyway.
const shutdownWait = 10 * time.Second

// NeedLeaderElection is false: every replica of a sharded group acts.
func (s *sharding) NeedLeaderElection() bool { return false }

// Start keeps this replica in its group until ctx ends: every renew
// period it renews its membership Lease, lists the group's Leases, and
// when the live replicas change, takes up the deployments it gains and
// lets go of those it loses. On the way out it releases its claims and
// deletes its Lease, so that the others take its share over at their next
// look instead of after a lease duration.
func (s *sharding) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("sharding").WithValues("replica", s.id, "group", s.opts.Group)
	ctx = log.IntoContext(ctx, logger)
	logger.Info("sharding: joining the group", "namespace", s.opts.Namespace, "lease", ReplicaLeaseName(s.id),
		"leaseDuration", s.opts.LeaseDuration, "renewPeriod", s.opts.RenewPeriod)
	// The first look needs the deployments: wait for the informer.
	if err := s.cache.List(ctx, &capstanv1.ClusterDeploymentList{}); err != nil && ctx.Err() == nil {
		return fmt.Errorf("sharding: list ClusterDeployments: %w", err)
	}
	t := time.NewTicker(s.opts.RenewPeriod)
	defer t.Stop()
	for {
		s.look(ctx)
		select {
		case <-ctx.Done():
			s.leaveGroup(ctx)
			return nil
		case <-t.C:
		}
	}
}

// look renews this replica's Lease, reads the group's and acts on what
// changed.
func (s *sharding) look(ctx context.Context) {
	logger := log.FromContext(ctx)
	// A renewal may take as long as this replica stays live without one:
	// on a busy API server a renewal that is slow but lands still counts.
	renewCtx, cancel := context.WithTimeout(ctx, s.opts.LeaseDuration-s.opts.RenewPeriod)
	err := s.renewOwn(renewCtx)
	cancel()
	if err != nil {
		logger.Info("sharding: could not renew the membership Lease", "error", err.Error())
	}
	rctx, cancel := context.WithTimeout(ctx, s.opts.LeaseDuration/2)
	defer cancel()
	leases := &coordinationv1.LeaseList{}
	err = s.leases.List(rctx, leases, client.InNamespace(s.opts.Namespace), client.MatchingLabels{ReplicaLabel: s.opts.Group})
	if err != nil {
		logger.Info("sharding: could not list the group's Leases; judging by the last list", "error", err.Error())
	}
	now := s.now()
	s.mu.Lock()
	if err == nil {
		s.seen = membershipLeases(leases.Items)
	}
	selfLive := !s.renewed.IsZero() && now.Sub(s.renewed) < s.opts.LeaseDuration-s.opts.RenewPeriod
	members := liveReplicas(s.seen, s.id, selfLive, now)
	s.mu.Unlock()
	if err == nil {
		s.deleteStale(rctx, membershipLeases(leases.Items), now)
	}
	s.setMembers(ctx, members)
}

// membershipLeases keeps the Leases named after their holder, the
// membership Leases: a Lease that carries the group label by mistake is
// neither counted nor deleted.
func membershipLeases(leases []coordinationv1.Lease) []coordinationv1.Lease {
	return slices.DeleteFunc(leases, func(l coordinationv1.Lease) bool {
		return l.Name != ReplicaLeaseName(ptr.Deref(l.Spec.HolderIdentity, ""))
	})
}

// liveReplicas returns the identities of the live replicas, sorted: those
// whose Lease has not expired, and self while its own renewals succeed
// (judged by its local clock, so that a replica cut off from the API
// server stops acting before the others take its share over).
func liveReplicas(leases []coordinationv1.Lease, self string, selfLive bool, now time.Time) []string {
	var out []string
	for i := range leases {
		holder := ptr.Deref(leases[i].Spec.HolderIdentity, "")
		if holder == "" || holder == self {
			continue
		}
		if now.Before(leaseExpiry(&leases[i])) {
			out = append(out, holder)
		}
	}
	if selfLive {
		out = append(out, self)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// setMembers makes members the live replicas. When they changed, the
// reconciles in progress of deployments this replica loses are cancelled
// (their claims go when they have returned), the claims of the others it
// loses are released, and the deployments it gains are queued.
func (s *sharding) setMembers(ctx context.Context, members []string) {
	list := &capstanv1.ClusterDeploymentList{}
	if err := s.cache.List(ctx, list); err != nil {
		return // only when ctx ends: the informer has synced
	}
	s.mu.Lock()
	old := s.members
	changed := !slices.Equal(old, members)
	s.members = members
	exists := make(map[types.NamespacedName]bool, len(list.Items))
	lost := map[types.NamespacedName]bool{}
	var gained []*capstanv1.ClusterDeployment
	owned := 0
	for i := range list.Items {
		cd := &list.Items[i]
		key := client.ObjectKeyFromObject(cd)
		exists[key] = true
		now := ShardOwner(cd.Namespace, cd.Name, members) == s.id
		if now {
			owned++
		}
		if !changed {
			continue
		}
		was := ShardOwner(cd.Namespace, cd.Name, old) == s.id
		switch {
		case now && !was:
			gained = append(gained, cd)
		case was && !now:
			lost[key] = true
		}
	}
	for key := range s.claims {
		if !exists[key] {
			delete(s.claims, key) // deleted: the claim went with it
		} else if ShardOwner(key.Namespace, key.Name, members) != s.id {
			lost[key] = true
		}
	}
	for key := range lost {
		if r := s.inflight[key]; r != nil {
			r.cancel() // leave releases the claim once it has returned
			delete(lost, key)
		}
	}
	s.mu.Unlock()
	s.metrics.Observe(s.id, owned, len(members))
	if !changed {
		return
	}
	log.FromContext(ctx).Info("sharding: live replicas changed", "replicas", members, "owned", owned, "gained", len(gained), "lost", len(lost))
	rctx, cancel := context.WithTimeout(ctx, s.opts.LeaseDuration)
	defer cancel()
	s.forEach(rctx, lost, func(ctx context.Context, key types.NamespacedName) {
		s.release(ctx, key)
		s.forget(key.Namespace, key.Name)
	})
	if len(gained) > 0 {
		go s.queue(ctx, gained)
	}
}

// queue hands the deployments this replica gained to the controller.
func (s *sharding) queue(ctx context.Context, cds []*capstanv1.ClusterDeployment) {
	for _, cd := range cds {
		select {
		case s.enqueue <- event.GenericEvent{Object: cd}:
		case <-ctx.Done():
			return
		}
	}
}

// forEach runs fn on keys, a few at a time.
func (s *sharding) forEach(ctx context.Context, keys map[types.NamespacedName]bool, fn func(context.Context, types.NamespacedName)) {
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for key := range keys {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			fn(ctx, key)
		}()
	}
	wg.Wait()
}

// renewOwn renews this replica's membership Lease, creating it the first
// time.
func (s *sharding) renewOwn(ctx context.Context) error {
	key := client.ObjectKey{Namespace: s.opts.Namespace, Name: ReplicaLeaseName(s.id)}
	for range 2 {
		start := s.now()
		s.mu.Lock()
		own := s.own
		s.mu.Unlock()
		lease := &coordinationv1.Lease{}
		if own != nil {
			lease = own.DeepCopy()
		} else if err := s.leases.Get(ctx, key, lease); apierrors.IsNotFound(err) {
			lease = s.memberLease(start)
			err := s.leases.Create(ctx, lease)
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("create the membership Lease %s/%s: %w", key.Namespace, key.Name, err)
			}
			s.renewedOwn(lease, start)
			return nil
		} else if err != nil {
			return fmt.Errorf("read the membership Lease %s/%s: %w", key.Namespace, key.Name, err)
		}
		if lease.Labels == nil {
			lease.Labels = map[string]string{}
		}
		lease.Labels[ReplicaLabel] = s.opts.Group
		lease.Spec.HolderIdentity = ptr.To(s.id)
		lease.Spec.LeaseDurationSeconds = ptr.To(int32(s.opts.LeaseDuration / time.Second))
		lease.Spec.RenewTime = &metav1.MicroTime{Time: start}
		err := s.leases.Update(ctx, lease)
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			s.mu.Lock()
			s.own = nil
			s.mu.Unlock()
			continue
		}
		if err != nil {
			return fmt.Errorf("renew the membership Lease %s/%s: %w", key.Namespace, key.Name, err)
		}
		s.renewedOwn(lease, start)
		return nil
	}
	return errors.New("renew the membership Lease: it kept changing")
}

func (s *sharding) renewedOwn(lease *coordinationv1.Lease, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.own, s.renewed = lease, at
}

func (s *sharding) memberLease(now time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: s.opts.Namespace, Name: ReplicaLeaseName(s.id),
			Labels: map[string]string{"app.kubernetes.io/managed-by": "capstan", ReplicaLabel: s.opts.Group},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(s.id),
			LeaseDurationSeconds: ptr.To(int32(s.opts.LeaseDuration / time.Second)),
			AcquireTime:          &metav1.MicroTime{Time: now},
			RenewTime:            &metav1.MicroTime{Time: now},
		},
	}
}

// deleteStale deletes the Leases of replicas that died long ago (a
// replica that stops deletes its own; one that crashed cannot).
func (s *sharding) deleteStale(ctx context.Context, leases []coordinationv1.Lease, now time.Time) {
	for i := range leases {
		l := &leases[i]
		if ptr.Deref(l.Spec.HolderIdentity, "") == s.id {
			continue
		}
		d := time.Duration(max(ptr.Deref(l.Spec.LeaseDurationSeconds, 0), 1)) * time.Second
		if now.Before(leaseExpiry(l).Add(staleLeaseDurations * d)) {
			continue
		}
		rv := l.ResourceVersion
		if err := s.leases.Delete(ctx, l, client.Preconditions{ResourceVersion: &rv}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			log.FromContext(ctx).Info("sharding: could not delete the Lease of a replica gone", "lease", l.Name, "error", err.Error())
		}
	}
}

// leaveGroup stops this replica acting: no deployment is its own any
// more, the reconciles in progress are cancelled and waited for, then the
// claims are released and the membership Lease deleted.
func (s *sharding) leaveGroup(ctx context.Context) {
	s.mu.Lock()
	s.stopping = true
	for _, r := range s.inflight {
		r.cancel()
	}
	timedOut := false
	timer := time.AfterFunc(shutdownWait, func() {
		s.mu.Lock()
		timedOut = true
		s.idle.Broadcast()
		s.mu.Unlock()
	})
	for len(s.inflight) > 0 && !timedOut {
		s.idle.Wait()
	}
	timer.Stop()
	keys := make(map[types.NamespacedName]bool, len(s.claims))
	for key := range s.claims {
		keys[key] = true
	}
	own := s.own
	s.members = nil
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.LeaseDuration)
	defer cancel()
	s.forEach(ctx, keys, s.release)
	if own != nil {
		rv := own.ResourceVersion
		if err := s.leases.Delete(ctx, own, client.Preconditions{ResourceVersion: &rv}); err != nil && !apierrors.IsNotFound(err) {
			log.FromContext(ctx).Info("sharding: could not delete the membership Lease; it expires by itself", "error", err.Error())
		}
	}
	s.metrics.Forget(s.id)
	log.FromContext(ctx).Info("sharding: left the group", "released", len(keys))
}
