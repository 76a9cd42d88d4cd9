package reconciler

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// TestLeftByCapstan: an object is as Capstan's apply left it only while
// it holds the labels and annotations applied and no other manager wrote
// to it after Capstan's apply, in the same second included; writes to
// its status do not count.
func TestLeftByCapstan(t *testing.T) {
	owner := stages.Owner{Name: "cd", Namespace: "ns"}
	applied := metav1.NewTime(time.Date(2026, 1, 1, 10, 0, 10, 0, time.UTC))
	entry := func(manager, sub string, at time.Time) metav1.ManagedFieldsEntry {
		op := metav1.ManagedFieldsOperationUpdate
		if manager == stages.FieldManager {
			op = metav1.ManagedFieldsOperationApply
		}
		when := metav1.NewTime(at)
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: op, Subresource: sub, Time: &when}
	}
	obj := &unstructured.Unstructured{}
	obj.SetLabels(map[string]string{"app": "x", stages.StageKey: "A"})
	obj.SetAnnotations(map[string]string{"note": "y"})
	labels := map[string]string{"app": "x", stages.StageKey: "A", stages.OwnerNameLabel: "cd", stages.OwnerNamespaceLabel: "ns"}
	for _, tc := range []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		fields      []metav1.ManagedFieldsEntry
		want        bool
	}{
		{"capstan alone", labels, map[string]string{"note": "y"}, []metav1.ManagedFieldsEntry{entry(stages.FieldManager, "", applied.Time)}, true},
		{"older writer", labels, map[string]string{"note": "y"}, []metav1.ManagedFieldsEntry{entry("kubectl", "", applied.Add(-time.Minute)), entry(stages.FieldManager, "", applied.Time)}, true},
		{"status written after", labels, map[string]string{"note": "y"}, []metav1.ManagedFieldsEntry{entry(stages.FieldManager, "", applied.Time), entry("kcm", "status", applied.Add(time.Minute))}, true},
		{"written after", labels, map[string]string{"note": "y"}, []metav1.ManagedFieldsEntry{entry(stages.FieldManager, "", applied.Time), entry("kubectl-edit", "", applied.Add(time.Minute))}, false},
		{"written in the same second", labels, map[string]string{"note": "y"}, []metav1.ManagedFieldsEntry{entry(stages.FieldManager, "", applied.Time), entry("kubectl-edit", "", applied.Time)}, false},
		{"scaled after", labels, map[string]string{"note": "y"}, []metav1.ManagedFieldsEntry{entry(stages.FieldManager, "", applied.Time), entry(stages.FieldManager+"-scale", "", applied.Add(time.Second))}, false},
		{"annotation removed", labels, nil, []metav1.ManagedFieldsEntry{entry(stages.FieldManager, "", applied.Time)}, false},
		{"other stage", map[string]string{"app": "x", stages.StageKey: "B", stages.OwnerNameLabel: "cd", stages.OwnerNamespaceLabel: "ns"}, map[string]string{"note": "y"}, []metav1.ManagedFieldsEntry{entry(stages.FieldManager, "", applied.Time)}, false},
		{"never applied", labels, map[string]string{"note": "y"}, []metav1.ManagedFieldsEntry{entry("kubectl", "", applied.Time)}, false},
	} {
		live := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Labels: tc.labels, Annotations: tc.annotations, ManagedFields: tc.fields}}
		if got := leftByCapstan(live, obj, owner, "A"); got != tc.want {
			t.Errorf("%s: leftByCapstan = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestAdmissionChanged: a plan whose CRDs, webhook configurations or
// APIServices differ from the last walk's, one added, changed or
// removed, changes admission; other objects do not count.
func TestAdmissionChanged(t *testing.T) {
	crd := func(desc string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("apiextensions.k8s.io/v1")
		u.SetKind("CustomResourceDefinition")
		u.SetName("gadgets.example.com")
		u.Object["spec"] = map[string]any{"description": desc}
		return u
	}
	config := func(v string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("v1")
		u.SetKind("ConfigMap")
		u.SetName("c")
		u.SetNamespace("ns")
		u.Object["data"] = map[string]any{"k": v}
		return u
	}
	setOf := func(objs ...*unstructured.Unstructured) *desiredSet {
		set := &desiredSet{objects: map[driftKey]desiredObject{}}
		for _, obj := range objs {
			data, err := obj.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			set.objects[driftKey{ref: localRef, id: stages.ObjectID(obj)}] = desiredObject{stage: "A", json: data}
		}
		return set
	}
	planOf := func(objs ...*unstructured.Unstructured) *stages.Plan {
		return &stages.Plan{Stages: []stages.Stage{{StageSpec: capstanv1.StageSpec{Name: "A", Action: capstanv1.StageActionApply}, Objects: objs}}}
	}
	for _, tc := range []struct {
		name string
		plan *stages.Plan
		set  *desiredSet
		want bool
	}{
		{"same", planOf(crd("a"), config("x")), setOf(crd("a"), config("y")), false},
		{"changed", planOf(crd("b"), config("x")), setOf(crd("a"), config("x")), true},
		{"added", planOf(crd("a"), config("x")), setOf(config("x")), true},
		{"removed", planOf(config("x")), setOf(crd("a"), config("x")), true},
	} {
		if got := admissionChanged(tc.plan, tc.set); got != tc.want {
			t.Errorf("%s: admissionChanged = %v, want %v", tc.name, got, tc.want)
		}
	}
}
