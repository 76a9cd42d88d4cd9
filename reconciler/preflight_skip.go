package reconciler

import (
	"bytes"
	"maps"

	"github.com/fluxcd/cli-utils/pkg/object"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// unchangedSinceReady returns, for the preflight of a's plan, the objects
// whose server-side dry run cannot answer anything the last walk did not
// (stages.PreflightOptions.Unchanged), or nil when it knows of none. An
// object is one only when all of these hold:
//
//   - the deployment is Ready at the revision and generation of the
//     desired set the drift watcher keeps, the generation is still the
//     deployment's, and spec.drift is correct: every object of that set
//     was applied, and what drifted since was (or is about to be) applied
//     again;
//   - no CRD, webhook configuration, admission policy or APIService of
//     the plan differs from that set, and none went from it;
//   - the object, in the stage that applies it now, is byte for byte the
//     one that set holds (the owner labels the apply adds are the same:
//     same deployment, same stage);
//   - the drift watcher holds the live object, noted no drift of it, and
//     the object still carries the labels and annotations applied, with
//     Capstan's apply the newest write to it (no other manager wrote after).
//
// The UID and resourceVersion returned are those the watcher holds: the
// apply trusts the skip only while the live object is that one.
func (r *Reconciler) unchangedSinceReady(a *attempt) func(*unstructured.Unstructured) (types.UID, string, bool) {
	key := types.NamespacedName{Namespace: a.cd.Namespace, Name: a.cd.Name}
	set := r.drift.lastDesired(key)
	cd := a.cd
	if set == nil || !conditionTrue(cd, capstanv1.ConditionReady) || cd.Status.Revision != set.revision ||
		cd.Status.ObservedGeneration != set.generation || cd.Generation != set.generation ||
		cd.Spec.Drift == capstanv1.DriftReport || cd.Spec.Drift == capstanv1.DriftIgnore {
		return nil
	}
	stageOf := map[*unstructured.Unstructured]string{}
	for i := range a.plan.Stages {
		stage := &a.plan.Stages[i]
		if stage.Action != capstanv1.StageActionApply && stage.Action != "" || kubeConfigFor(cd, stage) != nil {
			continue
		}
		for _, obj := range stage.Objects {
			if _, dup := stageOf[obj]; !dup {
				stageOf[obj] = stage.Name
			}
		}
	}
	if admissionChanged(a.plan, set) {
		return nil
	}
	return func(obj *unstructured.Unstructured) (types.UID, string, bool) {
		stage, ok := stageOf[obj]
		if !ok {
			return "", "", false
		}
		id := stages.ObjectID(obj)
		d, ok := set.objects[driftKey{ref: localRef, id: id}]
		if !ok || d.stage != stage {
			return "", "", false
		}
		data, err := obj.MarshalJSON()
		if err != nil || !bytes.Equal(data, d.json) {
			return "", "", false
		}
		live := r.drift.undrifted(key, id)
		if live == nil || !leftByCapstan(live, obj, stages.Owner{Name: cd.Name, Namespace: cd.Namespace}, stage) {
			return "", "", false
		}
		return live.UID, live.ResourceVersion, true
	}
}

// admissionChanged reports whether the objects of plan that change
// admission (stages.ChangesAdmission), in whichever cluster, differ from
// those of set: added, removed or changed.
func admissionChanged(plan *stages.Plan, set *desiredSet) bool {
	before := map[string][]byte{}
	for dk, d := range set.objects {
		m, err := object.ParseObjMetadata(dk.id)
		if err != nil {
			return true
		}
		probe := &unstructured.Unstructured{}
		probe.SetGroupVersionKind(m.GroupKind.WithVersion("v1"))
		if !stages.ChangesAdmission(probe) {
			continue
		}
		if seen, ok := before[dk.id]; ok && !bytes.Equal(seen, d.json) {
			return true
		}
		before[dk.id] = d.json
	}
	now := map[string][]byte{}
	for _, obj := range plan.AppliedObjects() {
		if !stages.ChangesAdmission(obj) {
			continue
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return true
		}
		now[stages.ObjectID(obj)] = data
	}
	return !maps.EqualFunc(before, now, bytes.Equal)
}

// leftByCapstan reports whether live, the drift watcher's metadata of an
// object obj's stage applied, still is as Capstan's apply left it: owned
// by this deployment and stage, with the labels and annotations obj
// applies, and no write by another manager after Capstan's last apply
// (entry times are whole seconds: a write within the same second counts
// as after). Writes to subresources (status) do not count.
func leftByCapstan(live *metav1.PartialObjectMetadata, obj *unstructured.Unstructured, owner stages.Owner, stage string) bool {
	want := obj.GetLabels()
	if want == nil {
		want = map[string]string{}
	}
	maps.Copy(want, map[string]string{stages.OwnerNameLabel: owner.Name, stages.OwnerNamespaceLabel: owner.Namespace, stages.StageKey: stage})
	if !contains(live.Labels, want) || !contains(live.Annotations, obj.GetAnnotations()) {
		return false
	}
	applied := appliedEntry(live)
	if applied == nil || applied.Time == nil {
		return false
	}
	for i := range live.ManagedFields {
		mf := &live.ManagedFields[i]
		if mf == applied || mf.Subresource != "" {
			continue
		}
		if mf.Time == nil || !mf.Time.Before(applied.Time) {
			return false
		}
	}
	return true
}

// contains reports whether have holds every key of want with its value.
func contains(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}
