package reconciler

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// dependencyRecheck is how often a deployment waiting on others looks
// again, in case a watch event was missed; the watch on the dependencies'
// Ready condition normally wakes it at once.
const dependencyRecheck = 30 * time.Second

// checkDependencies ends the reconcile, applying nothing, while a
// deployment named in spec.dependsOn is not Ready at its current
// generation. Status says which, and the deployment's stages wait.
func (r *Reconciler) checkDependencies(ctx context.Context, a *attempt) (bool, error) {
	var waiting []string
	for _, dep := range a.cd.Spec.DependsOn {
		key := dependencyKey(a.cd, dep)
		other := &capstanv1.ClusterDeployment{}
		switch err := r.client.Get(ctx, key, other); {
		case client.IgnoreNotFound(err) != nil:
			return false, fmt.Errorf("dependency %s: %w", key, err)
		case err != nil:
			waiting = append(waiting, key.String()+" (not found)")
		case !deploymentReady(other):
			waiting = append(waiting, key.String())
		}
	}
	if len(waiting) == 0 {
		return false, nil
	}
	before := a.cd.DeepCopy()
	msg := "waiting for ClusterDeployment " + strings.Join(waiting, ", ") + " to be Ready"
	setCondition(a.cd, capstanv1.ConditionReady, false, "DependencyNotReady", msg)
	setCondition(a.cd, capstanv1.ConditionReconciling, true, "DependencyNotReady", msg)
	setCondition(a.cd, capstanv1.ConditionStalled, false, "DependencyNotReady", "")
	if err := r.patchStatus(ctx, before, a.cd); err != nil {
		return false, err
	}
	a.requeue = dependencyRecheck
	return true, nil
}

func dependencyKey(cd *capstanv1.ClusterDeployment, dep capstanv1.DependencyReference) types.NamespacedName {
	ns := dep.Namespace
	if ns == "" {
		ns = cd.Namespace
	}
	return types.NamespacedName{Namespace: ns, Name: dep.Name}
}

// deploymentReady reports whether every stage of cd is Ready at its
// current spec.
func deploymentReady(cd *capstanv1.ClusterDeployment) bool {
	return conditionTrue(cd, capstanv1.ConditionReady) && cd.Status.ObservedGeneration == cd.Generation
}

// dependents maps a deployment to the deployments that depend on it, so
// that they are reconciled when it becomes Ready (or stops being).
func (r *Reconciler) dependents(ctx context.Context, obj client.Object) []reconcile.Request {
	list := &capstanv1.ClusterDeploymentList{}
	if err := r.client.List(ctx, list); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		cd := &list.Items[i]
		for _, dep := range cd.Spec.DependsOn {
			if dependencyKey(cd, dep) == (types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()}) {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(cd)})
				break
			}
		}
	}
	return out
}

// readinessChanged passes the updates that flip a deployment's readiness.
var readinessChanged = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return true },
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	GenericFunc: func(event.GenericEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, ok1 := e.ObjectOld.(*capstanv1.ClusterDeployment)
		cur, ok2 := e.ObjectNew.(*capstanv1.ClusterDeployment)
		return ok1 && ok2 && deploymentReady(old) != deploymentReady(cur)
	},
}
