package reconciler

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// RefetchRequestedAnnotation, set to the same value as
// ReconcileRequestedAnnotation, makes that requested reconcile download
// the source's content and render it again, and walk every stage, even
// when the revision has not moved (`capstan reconcile --with-source`).
// A reconcile always asks the remote for its revision first, so a new
// commit lands with ReconcileRequestedAnnotation alone.
const RefetchRequestedAnnotation = "capstan.dev/refetch-requested-at"

// pendingRequest returns the value of cd's reconcile request when it is
// not answered yet (status.lastHandledReconcileAt differs), and whether it
// asks for the source to be fetched again.
func pendingRequest(cd *capstanv1.ClusterDeployment) (requested string, refetch bool) {
	requested = cd.Annotations[ReconcileRequestedAnnotation]
	if requested == "" || requested == cd.Status.LastHandledReconcileAt {
		return "", false
	}
	return requested, cd.Annotations[RefetchRequestedAnnotation] == requested
}

// refetch drops what the reconciler keeps of a's source content: its
// artifacts and the plan rendered from them, so that this attempt
// downloads and renders them again.
func (r *Reconciler) refetch(a *attempt) {
	a.source.mu.Lock()
	a.source.store.Drop(a.source.key)
	a.source.refused, a.source.refusal = "", nil
	a.source.mu.Unlock()
	r.plans.drop(client.ObjectKeyFromObject(a.cd))
}

// markHandled records in status that the request was answered, once the
// attempt is over: `capstan reconcile --wait` then reads the status as
// the outcome of that attempt.
func (r *Reconciler) markHandled(ctx context.Context, cd *capstanv1.ClusterDeployment, requested string) {
	if requested == "" || cd.Status.LastHandledReconcileAt == requested {
		return
	}
	before := cd.DeepCopy()
	cd.Status.LastHandledReconcileAt = requested
	if err := r.patchStatus(ctx, before, cd); err != nil {
		log.FromContext(ctx).Error(err, "record the handled reconcile request", "requestedAt", requested)
	}
}
