package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/stages"
)

// desiredSet is what a deployment's plan applies, in every cluster its
// stages act on, at one revision and generation, kept compactly (JSON) so
// that drift is corrected without fetching and rendering again.
type desiredSet struct {
	revision   string
	generation int64
	objects    map[driftKey]desiredObject
}

type desiredObject struct {
	stage string
	json  []byte
}

// desiredOf builds the desired set of a plan, each object under the
// kubeconfig its stage acts through, as the inventory records it. Objects
// a delete stage removes are left out (they must stay gone), and so are
// those of stages whose kubeconfig reference cannot be resolved (they
// were not applied); an object a scale stage sets the replicas of is kept
// without spec.replicas, which the scale stage owns.
func desiredOf(cd *capstanv1.ClusterDeployment, revision string, plan *stages.Plan) (*desiredSet, error) {
	set := &desiredSet{revision: revision, generation: cd.Generation, objects: map[driftKey]desiredObject{}}
	deleted, scaled := map[string]bool{}, map[string]bool{}
	for i := range plan.Stages {
		for _, obj := range plan.Stages[i].Objects {
			switch plan.Stages[i].Action {
			case capstanv1.StageActionDelete:
				deleted[stages.ObjectID(obj)] = true
			case capstanv1.StageActionScale:
				scaled[stages.ObjectID(obj)] = true
			}
		}
	}
	var applied []*unstructured.Unstructured
	for i := range plan.Stages {
		stage := &plan.Stages[i]
		if stage.Action != capstanv1.StageActionApply && stage.Action != "" {
			continue
		}
		ref := localRef
		if kc := kubeConfigFor(cd, stage); kc != nil {
			if applied == nil {
				applied = plan.AppliedObjects()
			}
			key, err := resolveKubeConfig(cd, kc, applied)
			if err != nil {
				continue
			}
			ref = key
		}
		for _, obj := range stage.Objects {
			id := stages.ObjectID(obj)
			if deleted[id] {
				continue
			}
			if scaled[id] {
				obj = obj.DeepCopy()
				unstructured.RemoveNestedField(obj.Object, "spec", "replicas")
			}
			data, err := obj.MarshalJSON()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", stages.ObjectRef(obj), err)
			}
			set.objects[driftKey{ref: ref, id: id}] = desiredObject{stage: stage.Name, json: data}
		}
	}
	return set, nil
}

// remember keeps the desired set of a deployment for later corrections.
func (w *driftWatcher) remember(key types.NamespacedName, set *desiredSet) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.desired == nil {
		w.desired = map[types.NamespacedName]*desiredSet{}
	}
	w.desired[key] = set
}

// desiredFor returns the desired set kept for a deployment at this
// revision and generation, or nil.
func (w *driftWatcher) desiredFor(key types.NamespacedName, revision string, generation int64) *desiredSet {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if set := w.desired[key]; set != nil && set.revision == revision && set.generation == generation {
		return set
	}
	return nil
}

func compareDriftKeys(a, b driftKey) int {
	return cmp.Or(cmp.Compare(a.ref.namespace, b.ref.namespace), cmp.Compare(a.ref.secret, b.ref.secret),
		cmp.Compare(a.ref.key, b.ref.key), cmp.Compare(a.id, b.id))
}

// correctDrift applies again, one by one, the objects of the desired set
// that drifted (spec.drift: correct), each in the cluster it was applied
// to, or only reports them (report). Objects not in the set (about to be
// pruned, removed by a delete stage) are left alone. What could not be
// corrected is noted again for the next attempt, which the error
// schedules.
func (r *Reconciler) correctDrift(ctx context.Context, cd *capstanv1.ClusterDeployment, set *desiredSet, drifted map[driftKey]string) error {
	if len(drifted) == 0 || set == nil || cd.Spec.Drift == capstanv1.DriftIgnore {
		return nil
	}
	owner := stages.Owner{Name: cd.Name, Namespace: cd.Namespace}
	// One connection per cluster and correction; a cluster that cannot be
	// reached is asked once.
	home, err := r.local(cd)
	if err != nil {
		return err
	}
	executors := map[clusterKey]*stages.Executor{localRef: home}
	unreached := map[clusterKey]bool{}
	left := map[driftKey]string{}
	var errs []error
	for _, dk := range slices.SortedFunc(maps.Keys(drifted), compareDriftKeys) {
		d, ok := set.objects[dk]
		if !ok {
			continue
		}
		what, ref := drifted[dk], stages.EntryRef(dk.id)
		if cd.Spec.Drift == capstanv1.DriftReport {
			r.metrics.CountDrift(cd, metrics.DriftReported)
			r.event(cd, "Warning", "DriftDetected", "%s was %s%s; spec.drift is report, so it stays as it is", ref, what, dk.where())
			continue
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(d.json); err != nil {
			errs = append(errs, fmt.Errorf("%s%s: %w", ref, dk.where(), err))
			continue
		}
		if unreached[dk.ref] {
			left[dk] = what
			continue
		}
		exec, ok := executors[dk.ref]
		if !ok {
			var err error
			if exec, err = r.executorVia(ctx, cd, dk.ref); err != nil {
				unreached[dk.ref], left[dk] = true, what
				errs = append(errs, fmt.Errorf("correct drift through kubeconfig Secret %s/%s: %w", dk.ref.namespace, dk.ref.secret, err))
				continue
			}
			executors[dk.ref] = exec
		}
		if err := exec.Reapply(ctx, obj, d.stage, owner); err != nil {
			left[dk] = what
			errs = append(errs, err)
			continue
		}
		r.metrics.CountDrift(cd, metrics.DriftCorrected)
		r.event(cd, "Normal", "DriftCorrected", "%s was %s%s; applied it again", ref, what, dk.where())
	}
	r.drift.restore(types.NamespacedName{Namespace: cd.Namespace, Name: cd.Name}, left)
	if len(errs) > 0 {
		return fmt.Errorf("correct drift: %w", errors.Join(errs...))
	}
	return nil
}

// correctFromPlan keeps the desired set of the attempt's plan and corrects
// what drifted of the deployment.
func (r *Reconciler) correctFromPlan(ctx context.Context, a *attempt) error {
	key := types.NamespacedName{Namespace: a.cd.Namespace, Name: a.cd.Name}
	set, err := desiredOf(a.cd, a.revision, a.plan)
	if err != nil {
		return err
	}
	if a.verify {
		// The look covers what the watch noted before it, and what it
		// noted meanwhile of the objects the look applied again (a first
		// listing that found one missing). A failed look keeps no set, so
		// that the next attempt looks again.
		r.drift.take(key)
		handled, err := r.verifyDesired(ctx, a.cd, set, a.plan)
		left := r.drift.take(key)
		maps.DeleteFunc(left, func(dk driftKey, _ string) bool { return handled[dk] })
		r.drift.restore(key, left)
		if err != nil {
			return err
		}
	}
	r.drift.remember(key, set)
	return r.correctDrift(ctx, a.cd, set, r.drift.take(key))
}
