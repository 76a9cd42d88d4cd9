package reconciler

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
)

// A claim says which replica writes for a deployment: the Lease
// ClaimLeaseName(name) in the deployment's namespace, held by the
// replica's identity for LeaseDuration after its renewTime. Ownership
// (rendezvous hashing) says who should act; the claim makes sure that
// while two replicas disagree about it (each sees the membership change
// at its own renewal) only one writes:
//
//   - a replica takes a claim only when nobody holds it, its holder
//     released it, or its holder let it expire;
//   - the holder renews it while a reconcile is in progress (keepalive),
//     and writes only while its last renewal is less than half a duration
//     old by its own clock, so that clocks may disagree by up to half a
//     duration (minus a renew period) without two writers;
//   - a replica that no longer owns a deployment releases its claim, but
//     only after the reconcile in progress has returned.
//
// Claims are renewed lazily: a Ready deployment whose source did not
// change makes no write, so its claim is left to expire and is renewed at
// the next write (one update, no read).

// heldClaim is a claim this replica holds, or held last.
type heldClaim struct {
	// lease is the claim as this replica last wrote it.
	lease *coordinationv1.Lease
	// renewed is the local time just before that write.
	renewed time.Time
}

// ClaimHeldError says that another replica holds the claim of a
// deployment: this one does not write for it until the claim is released
// or expires.
type ClaimHeldError struct {
	// Namespace and Name are the deployment's.
	Namespace, Name string
	// Holder is the replica holding the claim, Until when it expires if
	// not renewed.
	Holder string
	Until  time.Time
}

func (e *ClaimHeldError) Error() string {
	return fmt.Sprintf("ClusterDeployment %s/%s is claimed by replica %s until %s (Lease %s/%s); this replica does not write for it",
		e.Namespace, e.Name, e.Holder, e.Until.Format(time.RFC3339Nano), e.Namespace, ClaimLeaseName(e.Name))
}

// ReasonHandedOver: a write was refused because another replica owns the
// deployment or holds its claim now (sharding). It is not a failure of
// the deployment: the attempt ends waiting, and the replica that has the
// deployment carries on.
const ReasonHandedOver = "HandedOver"

// Failure implements failure.Classified: the attempt waits until the
// claim expires, unless its holder releases it first.
func (e *ClaimHeldError) Failure() *failure.Error {
	return &failure.Error{Reason: ReasonHandedOver, Policy: failure.PolicyWait, Err: e, RetryAfter: max(time.Until(e.Until), time.Second)}
}

// Failure implements failure.Classified: the attempt waits; the owner
// reconciles the deployment.
func (e *NotOwnerError) Failure() *failure.Error {
	return &failure.Error{Reason: ReasonHandedOver, Policy: failure.PolicyWait, Err: e}
}

// NotOwnerError says that a deployment belongs to another replica now
// (sharding): this one does not write for it.
type NotOwnerError struct {
	// Namespace and Name are the deployment's.
	Namespace, Name string
	// Owner is the replica that owns it as this replica sees the group;
	// "" when it sees no live replica (its own Lease is not renewed).
	Owner string
}

func (e *NotOwnerError) Error() string {
	owner := "no live replica"
	if e.Owner != "" {
		owner = "replica " + e.Owner
	}
	return fmt.Sprintf("ClusterDeployment %s/%s belongs to %s now (sharding); this replica does not write for it", e.Namespace, e.Name, owner)
}

// hold returns nil when this replica may write for the deployment now: it
// owns it and holds its claim, renewed less than half a duration ago
// (renewing or taking it if need be).
func (s *sharding) hold(ctx context.Context, key types.NamespacedName) error {
	s.mu.Lock()
	owned := s.ownsLocked(key)
	owner := ShardOwner(key.Namespace, key.Name, s.members)
	c := s.claims[key]
	fresh := c != nil && s.now().Before(c.renewed.Add(s.opts.LeaseDuration/2))
	s.mu.Unlock()
	if !owned {
		return &NotOwnerError{Namespace: key.Namespace, Name: key.Name, Owner: owner}
	}
	if fresh {
		return nil
	}
	held, err := s.take(ctx, key)
	if err != nil {
		return err
	}
	if held != nil {
		return held
	}
	return nil
}

// claimFirst takes the claim of a deployment at the first reconcile since
// this replica came to own it, before anything is read from the source:
// while the former owner still holds it, the reconcile is put off (the
// returned wait) rather than failed at its first write.
func (s *sharding) claimFirst(ctx context.Context, key types.NamespacedName) (time.Duration, error) {
	s.mu.Lock()
	_, held := s.claims[key]
	s.mu.Unlock()
	if held {
		return 0, nil
	}
	if err := s.cache.Get(ctx, key, &capstanv1.ClusterDeployment{}); apierrors.IsNotFound(err) {
		return 0, nil // gone: nothing will be written for it
	}
	other, err := s.take(ctx, key)
	if err != nil {
		return 0, err
	}
	if other == nil {
		return 0, nil
	}
	// The former owner releases it at its next look at the group, after
	// its reconcile in progress; come back then, or when it expires.
	wait := min(time.Until(other.Until), s.opts.RenewPeriod)
	return max(wait, 10*time.Millisecond) + rand.N(s.opts.RenewPeriod/10+1), nil
}

// take renews or takes the claim of a deployment. It returns a
// ClaimHeldError (not an error of the request) when another replica holds
// it.
func (s *sharding) take(ctx context.Context, key types.NamespacedName) (*ClaimHeldError, error) {
	s.mu.Lock()
	c := s.claims[key]
	s.mu.Unlock()
	if c != nil {
		// Renew what this replica wrote last, without reading it first:
		// the update fails if anyone changed it since.
		ok, err := s.writeClaim(ctx, key, c.lease.DeepCopy(), false)
		if ok || err != nil {
			return nil, err
		}
	}
	for range 3 {
		lease := &coordinationv1.Lease{}
		err := s.leases.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: ClaimLeaseName(key.Name)}, lease)
		if apierrors.IsNotFound(err) {
			ok, err := s.createClaim(ctx, key)
			if ok || err != nil {
				return nil, err
			}
			continue // created by another replica in between
		}
		if err != nil {
			return nil, fmt.Errorf("read the claim %s/%s: %w", key.Namespace, ClaimLeaseName(key.Name), err)
		}
		holder := ptr.Deref(lease.Spec.HolderIdentity, "")
		if holder != "" && holder != s.id {
			if until := leaseExpiry(lease); s.now().Before(until) {
				s.mu.Lock()
				delete(s.claims, key)
				s.mu.Unlock()
				return &ClaimHeldError{Namespace: key.Namespace, Name: key.Name, Holder: holder, Until: until}, nil
			}
		}
		ok, err := s.writeClaim(ctx, key, lease, holder != s.id)
		if ok || err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("take the claim %s/%s: it kept changing", key.Namespace, ClaimLeaseName(key.Name))
}

// writeClaim writes lease as held by this replica from now; false when
// someone changed or deleted it since it was read.
func (s *sharding) writeClaim(ctx context.Context, key types.NamespacedName, lease *coordinationv1.Lease, takeover bool) (bool, error) {
	start := s.now()
	lease.Spec.HolderIdentity = ptr.To(s.id)
	lease.Spec.LeaseDurationSeconds = ptr.To(int32(s.opts.LeaseDuration / time.Second))
	lease.Spec.RenewTime = &metav1.MicroTime{Time: start}
	if takeover {
		lease.Spec.AcquireTime = &metav1.MicroTime{Time: start}
		lease.Spec.LeaseTransitions = ptr.To(ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1)
	}
	// The update carries the resourceVersion read: it fails on a
	// concurrent change instead of overwriting it.
	err := s.leases.Update(ctx, lease)
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("renew the claim %s/%s: %w", key.Namespace, lease.Name, err)
	}
	s.keep(key, lease, start)
	return true, nil
}

// createClaim creates the claim held by this replica, owned by the
// deployment so that it goes with it; false when it exists already.
func (s *sharding) createClaim(ctx context.Context, key types.NamespacedName) (bool, error) {
	start := s.now()
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: key.Namespace, Name: ClaimLeaseName(key.Name),
			// Not ReplicaLabel: a claim is no membership Lease.
			Labels: map[string]string{"app.kubernetes.io/managed-by": "capstan", ClaimLabel: key.Name},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(s.id),
			LeaseDurationSeconds: ptr.To(int32(s.opts.LeaseDuration / time.Second)),
			AcquireTime:          &metav1.MicroTime{Time: start},
			RenewTime:            &metav1.MicroTime{Time: start},
			LeaseTransitions:     ptr.To[int32](0),
		},
	}
	cd := &capstanv1.ClusterDeployment{}
	if err := s.cache.Get(ctx, key, cd); err == nil {
		lease.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: capstanv1.GroupVersion.String(), Kind: "ClusterDeployment", Name: cd.Name, UID: cd.UID,
		}}
	}
	err := s.leases.Create(ctx, lease)
	if apierrors.IsAlreadyExists(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("create the claim %s/%s: %w", key.Namespace, lease.Name, err)
	}
	s.keep(key, lease, start)
	return true, nil
}

func (s *sharding) keep(key types.NamespacedName, lease *coordinationv1.Lease, renewed time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claims[key] = &heldClaim{lease: lease, renewed: renewed}
}

// release gives a claim up so that the next owner need not wait for it to
// expire. The delete carries the resourceVersion this replica last wrote:
// a claim another replica has taken since stays.
func (s *sharding) release(ctx context.Context, key types.NamespacedName) {
	s.mu.Lock()
	c := s.claims[key]
	delete(s.claims, key)
	s.mu.Unlock()
	if c == nil {
		return
	}
	rv := c.lease.ResourceVersion
	err := s.leases.Delete(ctx, c.lease, client.Preconditions{ResourceVersion: &rv})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		log.FromContext(ctx).Info("could not release a claim; it expires by itself", "claim", key.Namespace+"/"+c.lease.Name, "error", err.Error())
	}
}

// keepalive renews the claim of a deployment while its reconcile is in
// progress, and cancels the reconcile when the claim is lost, or when it
// cannot be renewed before half its duration has passed.
func (s *sharding) keepalive(ctx context.Context, key types.NamespacedName, cancel context.CancelFunc) {
	every := s.opts.LeaseDuration / 4
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		c := s.claims[key]
		s.mu.Unlock()
		if c == nil || s.now().Sub(c.renewed) < every {
			continue // not taken yet, or renewed by a write
		}
		rctx, rcancel := context.WithTimeout(ctx, s.opts.LeaseDuration/2)
		other, err := s.take(rctx, key)
		rcancel()
		if ctx.Err() != nil {
			return
		}
		switch {
		case other != nil:
			log.FromContext(ctx).Info("claim lost; the reconcile stops", "clusterDeployment", key.String(), "holder", other.Holder)
			cancel()
			return
		case err != nil && !s.now().Before(c.renewed.Add(s.opts.LeaseDuration/2)):
			log.FromContext(ctx).Info("claim not renewed in time; the reconcile stops", "clusterDeployment", key.String(), "error", err.Error())
			cancel()
			return
		}
	}
}

// leaseExpiry is when a Lease expires unless renewed.
func leaseExpiry(l *coordinationv1.Lease) time.Time {
	var t time.Time
	switch {
	case l.Spec.RenewTime != nil:
		t = l.Spec.RenewTime.Time
	case l.Spec.AcquireTime != nil:
		t = l.Spec.AcquireTime.Time
	default:
		t = l.CreationTimestamp.Time
	}
	return t.Add(time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second)
}

// IsClaimRefused reports whether err refuses a write because another
// replica owns the deployment or holds its claim.
func IsClaimRefused(err error) bool {
	var held *ClaimHeldError
	var notOwner *NotOwnerError
	return errors.As(err, &held) || errors.As(err, &notOwner)
}
