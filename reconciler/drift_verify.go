package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/fluxcd/pkg/ssa"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/log"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/stages"
)

// verifyGroup is the objects of a desired set that one stage applies
// through one kubeconfig.
type verifyGroup struct {
	ref   clusterKey
	stage string
	order int
	keys  []driftKey
	objs  []*unstructured.Unstructured
}

// verifyDesired checks every object of cd's desired set against its
// cluster once (stages.Executor.Verify: a dry run each, nothing written)
// and handles what it finds as drift found by the watch: missing or
// changed objects are applied again, one by one, under spec.drift:
// correct, or only reported under report. Stages go in plan order, as
// they were applied.
//
// The watch judges each write against the object just before it, so it
// cannot judge what was written while no Capstan watched (a field taken
// or removed during a restart, a change of leader or a handover between
// shards); this is the look that can, once per deployment and process.
// It returns the objects it applied again or reported: what the watch
// noted of them meanwhile (the first listing of a kind finding one
// missing) is about the state this look handled.
func (r *Reconciler) verifyDesired(ctx context.Context, cd *capstanv1.ClusterDeployment, set *desiredSet, plan *stages.Plan) (map[driftKey]bool, error) {
	if cd.Spec.Drift == capstanv1.DriftIgnore {
		return nil, nil
	}
	order := map[string]int{}
	for i := range plan.Stages {
		order[plan.Stages[i].Name] = i
	}
	groups := map[driftKey]*verifyGroup{} // by ref and stage (in id)
	for _, dk := range slices.SortedFunc(maps.Keys(set.objects), compareDriftKeys) {
		d := set.objects[dk]
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(d.json); err != nil {
			return nil, fmt.Errorf("%s%s: %w", stages.EntryRef(dk.id), dk.where(), err)
		}
		gk := driftKey{ref: dk.ref, id: d.stage}
		if groups[gk] == nil {
			groups[gk] = &verifyGroup{ref: dk.ref, stage: d.stage, order: order[d.stage]}
		}
		groups[gk].keys = append(groups[gk].keys, dk)
		groups[gk].objs = append(groups[gk].objs, obj)
	}
	sorted := slices.SortedFunc(func(yield func(*verifyGroup) bool) {
		for _, g := range groups {
			if !yield(g) {
				return
			}
		}
	}, func(a, b *verifyGroup) int {
		return cmp.Or(cmp.Compare(a.order, b.order), compareDriftKeys(driftKey{ref: a.ref}, driftKey{ref: b.ref}))
	})

	owner := stages.Owner{Name: cd.Name, Namespace: cd.Namespace}
	handled := map[driftKey]bool{}
	var errs []error
	for _, g := range sorted {
		exec, err := r.local(cd)
		if g.ref != localRef {
			exec, err = r.executorVia(ctx, cd, g.ref)
		}
		var entries []ssa.ChangeSetEntry
		if err == nil {
			entries, err = exec.Verify(ctx, g.objs, g.stage, owner)
		}
		if err != nil && g.ref != localRef {
			// Another cluster that cannot be reached leaves the deployment
			// as it is, as its drift watch does: its objects are not
			// looked at by this process, only watched once it answers.
			log.FromContext(ctx).Info("cannot check the objects applied to another cluster; leaving them to its drift watch",
				"stage", g.stage, "kubeconfigSecret", g.ref.namespace+"/"+g.ref.secret, "error", err.Error())
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for i, e := range entries {
			acted, err := r.verified(ctx, cd, exec, g, g.objs[i], e.Action, owner)
			if err != nil {
				errs = append(errs, err)
			}
			if acted {
				handled[g.keys[i]] = true
			}
		}
	}
	if len(errs) > 0 {
		return handled, fmt.Errorf("check what was applied: %w", errors.Join(errs...))
	}
	return handled, nil
}

// verified handles what Verify found of one object: nothing when the
// apply would not change it, otherwise the drift policy. It reports
// whether it applied or reported the object.
func (r *Reconciler) verified(ctx context.Context, cd *capstanv1.ClusterDeployment, exec *stages.Executor, g *verifyGroup, obj *unstructured.Unstructured, action ssa.Action, owner stages.Owner) (bool, error) {
	var what string
	switch action {
	case ssa.CreatedAction:
		what = "deleted while no Capstan watched it"
	case ssa.ConfiguredAction:
		what = "changed while no Capstan watched it"
	default:
		return false, nil
	}
	ref, where := stages.ObjectRef(obj), driftKey{ref: g.ref}.where()
	if cd.Spec.Drift == capstanv1.DriftReport {
		r.metrics.CountDrift(cd, metrics.DriftReported)
		r.event(cd, "Warning", "DriftDetected", "%s was %s%s; spec.drift is report, so it stays as it is", ref, what, where)
		return true, nil
	}
	if err := exec.Reapply(ctx, obj, g.stage, owner); err != nil {
		return false, err
	}
	r.metrics.CountDrift(cd, metrics.DriftCorrected)
	r.event(cd, "Normal", "DriftCorrected", "%s was %s%s; applied it again", ref, what, where)
	return true, nil
}
