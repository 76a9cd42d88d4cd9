package pivot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The fencing record says which Capstan owns a ClusterDeployment in one
// cluster: a Lease named FenceName(deployment) in the deployment's
// namespace of the cluster written to, whose holder is the owner's
// cluster identity (ClusterID) and whose leaseTransitions count the
// handovers. Every Capstan checks it before it writes for the deployment
// (CheckFence), the first one to write claims it, and a move hands it to
// the target (HandFence) before the target's controllers and Capstan may
// act. Being a record and not a liveness lease, it never expires: a
// Capstan that lost ownership stays fenced across restarts of either
// side, until an operator deletes the Lease.
const fencePrefix = "capstan-owner."

// FenceLabel on a fencing Lease names its deployment.
const FenceLabel = "capstan.dev/fence-of"

// OwnerNameAnnotation on the fencing Lease says in words which Capstan
// holds it (its identity is a UID).
const OwnerNameAnnotation = "capstan.dev/owner-name"

// FenceName is the name of the fencing Lease of a deployment: a DNS
// subdomain whatever the deployment's name.
func FenceName(deployment string) string {
	name := fencePrefix + deployment
	if len(name) <= 253 {
		return name
	}
	sum := sha256.Sum256([]byte(deployment))
	return name[:253-17] + "-" + hex.EncodeToString(sum[:8])
}

// ClusterID identifies the cluster c reaches: the UID of its kube-system
// namespace, which every cluster has from its start and keeps for life.
func ClusterID(ctx context.Context, c client.Reader) (string, error) {
	ns := &corev1.Namespace{}
	if err := c.Get(ctx, client.ObjectKey{Name: "kube-system"}, ns); err != nil {
		return "", fmt.Errorf("identify the cluster (read namespace kube-system): %w", err)
	}
	return string(ns.UID), nil
}

// FencedError says that another Capstan owns the deployment in the
// cluster written to: this one must not write for it.
type FencedError struct {
	// Namespace and Name are the deployment's.
	Namespace, Name string
	// Holder is the owner's identity, HolderName its description.
	Holder, HolderName string
	// Generation counts the handovers of the deployment.
	Generation int32
}

func (e *FencedError) Error() string {
	who := e.Holder
	if e.HolderName != "" {
		who = e.HolderName + " (" + e.Holder + ")"
	}
	return fmt.Sprintf("ClusterDeployment %s/%s is owned by the Capstan of %s since handover %d (Lease %s/%s); this Capstan does not write for it. Delete that Lease only if that Capstan is gone for good",
		e.Namespace, e.Name, who, e.Generation, e.Namespace, FenceName(e.Name))
}

// IsFenced reports whether err is a FencedError.
func IsFenced(err error) bool {
	var f *FencedError
	return errors.As(err, &f)
}

// CheckFence returns nil when the Capstan identified by id may write for
// deployment namespace/name through c: it holds the fencing record, or
// nobody does, in which case it claims it. A namespace that does not
// exist in that cluster holds no record and needs none yet: nothing of
// the deployment was ever moved there. Otherwise the error is a
// FencedError naming the owner.
func CheckFence(ctx context.Context, c client.Client, namespace, name, id, idName string) error {
	lease := &coordinationv1.Lease{}
	key := client.ObjectKey{Namespace: namespace, Name: FenceName(name)}
	err := c.Get(ctx, key, lease)
	if apierrors.IsNotFound(err) {
		lease = fenceLease(namespace, name, id, idName, 0)
		err = c.Create(ctx, lease)
		switch {
		case err == nil:
			return nil
		case apierrors.IsNotFound(err):
			return nil // no such namespace there
		case apierrors.IsAlreadyExists(err):
			err = c.Get(ctx, key, lease)
		}
	}
	if err != nil {
		return fmt.Errorf("read the fencing record %s/%s: %w", key.Namespace, key.Name, err)
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	if holder == id {
		return nil
	}
	return &FencedError{Namespace: namespace, Name: name, Holder: holder,
		HolderName: lease.Annotations[OwnerNameAnnotation], Generation: ptr.Deref(lease.Spec.LeaseTransitions, 0)}
}

// ClaimFence is CheckFence for a deployment that has most likely never
// written through c: it creates the record first, and reads it only when
// it exists already. The outcome is CheckFence's.
func ClaimFence(ctx context.Context, c client.Client, namespace, name, id, idName string) error {
	err := c.Create(ctx, fenceLease(namespace, name, id, idName, 0))
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return nil // no such namespace there
	case apierrors.IsAlreadyExists(err):
		return CheckFence(ctx, c, namespace, name, id, idName)
	}
	return fmt.Errorf("claim the fencing record %s/%s: %w", namespace, FenceName(name), err)
}

// HandFence gives deployment namespace/name in the cluster c reaches to
// the Capstan identified by to, counting one more handover; it creates the
// record (and the namespace) where there is none. Handing it to the
// holder again changes nothing, so a resumed move can repeat it.
func HandFence(ctx context.Context, c client.Client, namespace, name, to, toName string) error {
	if err := ensureNamespace(ctx, c, namespace); err != nil {
		return err
	}
	key := client.ObjectKey{Namespace: namespace, Name: FenceName(name)}
	lease := &coordinationv1.Lease{}
	err := c.Get(ctx, key, lease)
	switch {
	case apierrors.IsNotFound(err):
		if err := c.Create(ctx, fenceLease(namespace, name, to, toName, 1)); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create the fencing record %s/%s: %w", key.Namespace, key.Name, err)
		} else if err == nil {
			return nil
		}
		if err := c.Get(ctx, key, lease); err != nil {
			return fmt.Errorf("read the fencing record %s/%s: %w", key.Namespace, key.Name, err)
		}
	case err != nil:
		return fmt.Errorf("read the fencing record %s/%s: %w", key.Namespace, key.Name, err)
	}
	if ptr.Deref(lease.Spec.HolderIdentity, "") == to {
		return nil
	}
	lease.Spec.HolderIdentity = ptr.To(to)
	lease.Spec.LeaseTransitions = ptr.To(ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1)
	lease.Spec.AcquireTime = &metav1.MicroTime{Time: metav1.Now().Time}
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[OwnerNameAnnotation] = toName
	// The update carries the resourceVersion read: a concurrent change
	// makes it fail rather than be overwritten.
	if err := c.Update(ctx, lease); err != nil {
		return fmt.Errorf("hand the fencing record %s/%s to %s: %w", key.Namespace, key.Name, toName, err)
	}
	return nil
}

// FenceHolder returns the identity holding the fencing record of
// deployment namespace/name in the cluster c reaches; "" when none does.
func FenceHolder(ctx context.Context, c client.Reader, namespace, name string) (string, error) {
	lease := &coordinationv1.Lease{}
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: FenceName(name)}, lease)
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the fencing record %s/%s: %w", namespace, FenceName(name), err)
	}
	return ptr.Deref(lease.Spec.HolderIdentity, ""), nil
}

func fenceLease(namespace, name, id, idName string, generation int32) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: FenceName(name),
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "capstan", FenceLabel: name},
			Annotations: map[string]string{OwnerNameAnnotation: idName},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:   ptr.To(id),
			LeaseTransitions: ptr.To(generation),
			AcquireTime:      &metav1.MicroTime{Time: metav1.Now().Time},
		},
	}
}
