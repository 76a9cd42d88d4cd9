package reconciler

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
)

// dependencyRecheck is how often a deployment waiting on others looks
// again, in case a watch event was missed; the watch on the dependencies'
// Ready condition normally wakes it at once.
const dependencyRecheck = 30 * time.Second

// checkDependencies ends the reconcile, applying nothing, while a
// deployment named in spec.dependsOn is not Ready at its current
// generation and revision: Ready at an older revision than its source has
// now is not Ready, since what the dependency applies is about to change.
// The attempt ends waiting (failure.PolicyWait, conclude): status says
// which, and the deployment's stages wait.
func (r *Reconciler) checkDependencies(ctx context.Context, a *attempt) (bool, error) {
	if len(a.cd.Spec.DependsOn) == 0 || a.driftOnly {
		// A Ready deployment correcting drift keeps its objects as they
		// were applied, whatever its dependencies do now.
		return false, nil
	}
	// A cycle is reported, not stalled on: fixing it is an edit of any
	// deployment of the cycle, which must wake this one too.
	if cycle := r.dependencyCycle(ctx, a.cd); cycle != "" {
		return false, waitForDependencies(ReasonDependencyCycle,
			fmt.Sprintf("spec.dependsOn: the dependencies form a cycle (%s), so none of them can start: remove one of the dependsOn entries", cycle))
	}
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
		default:
			if why := r.behindSource(ctx, a, other); why != "" {
				waiting = append(waiting, key.String()+" ("+why+")")
			}
		}
	}
	if len(waiting) == 0 {
		return false, nil
	}
	return false, waitForDependencies(ReasonDependencyNotReady,
		"waiting for ClusterDeployment "+strings.Join(waiting, ", ")+" to be Ready")
}

// waitForDependencies is the error an attempt waiting for its
// dependencies ends with; a dependency's readiness (or the recheck) brings
// it back.
func waitForDependencies(reason, msg string) error {
	return &failure.Error{Reason: reason, Policy: failure.PolicyWait, Err: errors.New(msg), RetryAfter: dependencyRecheck}
}

// behindSource says why other, Ready, is Ready at an older revision than
// its source has now ("" when it is not): its next reconcile will apply
// another revision, which this deployment must wait for. The answer of
// other's source is shared through the source cache, as other's own poll
// would ask it; a suspended dependency stays at what it applied.
func (r *Reconciler) behindSource(ctx context.Context, a *attempt, other *capstanv1.ClusterDeployment) string {
	if other.Spec.Suspend || moved(other) {
		return ""
	}
	current := a.revision
	if !reflect.DeepEqual(other.Spec.Source, a.cd.Spec.Source) {
		src, err := r.sourceFor(ctx, other)
		if err != nil {
			return "its source: " + err.Error()
		}
		// Never waited for here: a slow source of other's must not hold
		// this deployment's worker (docs/deadlines.md). The check's end
		// wakes this deployment.
		ans, pending := src.revisionFor(client.ObjectKeyFromObject(a.cd), revisionMaxAge(other), other.Spec.TimeoutOrDefault())
		switch {
		case pending:
			return "its source is being checked"
		case ans.err != nil:
			return "its source: " + ans.err.Error()
		}
		current = ans.revision
	}
	if current != other.Status.Revision {
		return fmt.Sprintf("Ready at %s, its source is at %s", other.Status.Revision, current)
	}
	return ""
}

// dependencyCycle returns the cycle cd's dependencies lead back to cd
// through ("a -> b -> a"), or "" when there is none. A dependency not
// found ends its path.
func (r *Reconciler) dependencyCycle(ctx context.Context, cd *capstanv1.ClusterDeployment) string {
	start := client.ObjectKeyFromObject(cd)
	seen := map[types.NamespacedName]bool{start: true}
	var walk func(cur *capstanv1.ClusterDeployment, path []string) string
	walk = func(cur *capstanv1.ClusterDeployment, path []string) string {
		for _, dep := range cur.Spec.DependsOn {
			key := dependencyKey(cur, dep)
			if key == start {
				return strings.Join(append(path, key.String()), " -> ")
			}
			if seen[key] {
				continue
			}
			seen[key] = true
			next := &capstanv1.ClusterDeployment{}
			if err := r.client.Get(ctx, key, next); err != nil {
				continue
			}
			if c := walk(next, append(path, key.String())); c != "" {
				return c
			}
		}
		return ""
	}
	return walk(cd, []string{start.String()})
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

// dependsOnIndex indexes ClusterDeployments in the informer cache by the
// deployments their spec.dependsOn names ("namespace/name").
const dependsOnIndex = "capstan.dev/depends-on"

// dependsOnKeys is the index function of dependsOnIndex.
func dependsOnKeys(obj client.Object) []string {
	cd, ok := obj.(*capstanv1.ClusterDeployment)
	if !ok || len(cd.Spec.DependsOn) == 0 {
		return nil
	}
	keys := make([]string, 0, len(cd.Spec.DependsOn))
	for _, dep := range cd.Spec.DependsOn {
		keys = append(keys, dependencyKey(cd, dep).String())
	}
	return keys
}

// dependentsIndex finds the deployments that depend on one through
// dependsOnIndex, which it adds to the informer cache on first use:
// adding it in New would ask the API server for the kind before the
// daemon runs, and client-go indexes what is already cached when an index
// comes late.
type dependentsIndex struct {
	reader  client.Reader // the informer cache
	indexer client.FieldIndexer

	mu    sync.Mutex
	added bool
}

func (d *dependentsIndex) ensure(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.added {
		return nil
	}
	if err := d.indexer.IndexField(ctx, &capstanv1.ClusterDeployment{}, dependsOnIndex, dependsOnKeys); err != nil {
		return err
	}
	d.added = true
	return nil
}

// dependents maps a deployment to the deployments that depend on it, so
// that they are reconciled when it becomes Ready (or stops being). It
// reads only those: listing (and copying) every deployment on each
// readiness change made a fleet's start quadratic, 7 GB allocated for
// 1,000 deployments (docs/benchmarks.md).
func (d *dependentsIndex) dependents(ctx context.Context, obj client.Object) []reconcile.Request {
	key := types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()}.String()
	list := &capstanv1.ClusterDeploymentList{}
	err := d.ensure(ctx)
	if err == nil {
		err = d.reader.List(ctx, list, client.MatchingFields{dependsOnIndex: key})
	}
	if err != nil {
		log.FromContext(ctx).Error(err, "find the deployments that depend on this one", "clusterDeployment", key)
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

// readinessChanged passes the updates that flip a deployment's readiness,
// or move a Ready deployment to another revision.
var readinessChanged = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return true },
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	GenericFunc: func(event.GenericEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, ok1 := e.ObjectOld.(*capstanv1.ClusterDeployment)
		cur, ok2 := e.ObjectNew.(*capstanv1.ClusterDeployment)
		return ok1 && ok2 && (deploymentReady(old) != deploymentReady(cur) ||
			deploymentReady(cur) && old.Status.Revision != cur.Status.Revision)
	},
}
