package reconciler

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/capstan-dev/capstan/stages"
)

// managed is one managed-fields entry: manager, operation, subresource,
// time and fields as the API server writes them.
func managed(manager string, op metav1.ManagedFieldsOperationType, sub string, at time.Time, fields string) metav1.ManagedFieldsEntry {
	when := metav1.NewTime(at)
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: op, Subresource: sub, Time: &when, FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)}}
}

// TestFieldsDrift: a write is drift when it took a field Capstan applied
// (naming the manager that owns it now) or removed one (naming the
// writer when it is left with an entry, saying plainly when it is not);
// Capstan's own applies, writes to status and fields Capstan's scale
// manager took are not.
func TestFieldsDrift(t *testing.T) {
	applied := time.Date(2026, 1, 1, 10, 0, 10, 0, time.UTC)
	later := applied.Add(time.Minute)
	const (
		both     = `{"f:data":{"f:k":{},"f:x":{}},"f:metadata":{"f:labels":{"f:capstan.dev/stage":{}}}}`
		kOnly    = `{"f:data":{"f:k":{}},"f:metadata":{"f:labels":{"f:capstan.dev/stage":{}}}}`
		xOnly    = `{"f:data":{"f:x":{}},"f:metadata":{"f:labels":{"f:capstan.dev/stage":{}}}}`
		replicas = `{"f:spec":{"f:replicas":{}}}`
	)
	apply, update := metav1.ManagedFieldsOperationApply, metav1.ManagedFieldsOperationUpdate
	capstan := func(at time.Time, fields string) metav1.ManagedFieldsEntry {
		return managed(stages.FieldManager, apply, "", at, fields)
	}
	older := managed("before-first-apply", update, "", applied.Add(-time.Hour), `{"f:metadata":{"f:annotations":{"f:note":{}}}}`)
	kcm := managed("kcm", update, "", applied.Add(-time.Hour), `{"f:metadata":{"f:annotations":{"f:n":{}}}}`)
	kcmStatus := managed("kcm", update, "status", applied.Add(time.Hour), `{"f:status":{"f:phase":{}}}`)
	for _, tc := range []struct {
		name          string
		before, after []metav1.ManagedFieldsEntry
		want          []string // all in what the write is reported as; nil: no drift
	}{
		{"a key removed by a writer left with no field",
			[]metav1.ManagedFieldsEntry{capstan(applied, both)},
			[]metav1.ManagedFieldsEntry{capstan(applied, kOnly)},
			[]string{"changed: a field Capstan manages (.data.x) was removed by a writer that kept no field of the object, so no field manager is left to name"}},
		{"a key removed while an older manager, not the writer, has an entry",
			[]metav1.ManagedFieldsEntry{older, capstan(applied, both)},
			[]metav1.ManagedFieldsEntry{older, capstan(applied, kOnly)},
			[]string{"(.data.x) was removed by a writer that kept no field", "no field manager is left to name"}},
		{"a key removed while a manager with an entry for status too has one",
			[]metav1.ManagedFieldsEntry{kcm, kcmStatus, capstan(applied, both)},
			[]metav1.ManagedFieldsEntry{kcm, kcmStatus, capstan(applied, kOnly)},
			[]string{"no field manager is left to name"}},
		{"a key removed by a writer that set another",
			[]metav1.ManagedFieldsEntry{older, capstan(applied, both)},
			[]metav1.ManagedFieldsEntry{older, capstan(applied, kOnly), managed("kubectl-edit", update, "", later, `{"f:data":{"f:y":{}}}`)},
			[]string{"changed: a field Capstan manages (.data.x) was removed by kubectl-edit"}},
		{"two keys and a label removed",
			[]metav1.ManagedFieldsEntry{capstan(applied, both)},
			[]metav1.ManagedFieldsEntry{capstan(applied, `{"f:metadata":{}}`)},
			[]string{"fields Capstan manages (.data.k, .data.x, .metadata.labels.capstan.dev/stage) were removed"}},
		{"Capstan's entry gone with every field",
			[]metav1.ManagedFieldsEntry{capstan(applied, kOnly)},
			[]metav1.ManagedFieldsEntry{managed("kubectl-edit", update, "", later, `{"f:data":{"f:y":{}}}`)},
			[]string{"fields Capstan manages (.data.k, .metadata.labels.capstan.dev/stage) were removed by kubectl-edit"}},
		{"a key taken over",
			[]metav1.ManagedFieldsEntry{older, capstan(applied, both)},
			[]metav1.ManagedFieldsEntry{older, capstan(applied, xOnly), managed("kubectl-edit", update, "", later, `{"f:data":{"f:k":{}}}`)},
			[]string{"changed by kubectl-edit"}},
		{"Capstan applied again, with fewer fields",
			[]metav1.ManagedFieldsEntry{capstan(applied, both)},
			[]metav1.ManagedFieldsEntry{capstan(later, kOnly)},
			nil},
		{"Capstan applied again within the second, with more fields",
			[]metav1.ManagedFieldsEntry{managed("kubectl-edit", update, "", applied, `{"f:data":{"f:x":{}}}`), capstan(applied, kOnly)},
			[]metav1.ManagedFieldsEntry{capstan(applied, both)},
			nil},
		{"status written",
			[]metav1.ManagedFieldsEntry{capstan(applied, both)},
			[]metav1.ManagedFieldsEntry{capstan(applied, both), managed("kube-controller-manager", update, "status", later, `{"f:status":{"f:replicas":{}}}`)},
			nil},
		{"an annotation added by hand",
			[]metav1.ManagedFieldsEntry{capstan(applied, both)},
			[]metav1.ManagedFieldsEntry{capstan(applied, both), managed("kubectl-annotate", update, "", later, `{"f:metadata":{"f:annotations":{"f:n":{}}}}`)},
			nil},
		{"replicas taken by Capstan's scale stage",
			[]metav1.ManagedFieldsEntry{capstan(applied, `{"f:spec":{"f:replicas":{},"f:paused":{}}}`)},
			[]metav1.ManagedFieldsEntry{capstan(applied, `{"f:spec":{"f:paused":{}}}`), managed(stages.FieldManager+"-scale", apply, "", later, replicas)},
			nil},
		{"never applied by Capstan",
			[]metav1.ManagedFieldsEntry{managed("kubectl", update, "", applied, both)},
			[]metav1.ManagedFieldsEntry{managed("kubectl", update, "", later, kOnly)},
			nil},
	} {
		o := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1", ManagedFields: tc.before}}
		n := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "2", ManagedFields: tc.after}}
		got := fieldsDrift(o, n)
		if tc.want == nil {
			if got != "" {
				t.Errorf("%s: drift %q, want none", tc.name, got)
			}
			continue
		}
		for _, want := range tc.want {
			if !strings.Contains(got, want) {
				t.Errorf("%s: drift %q, want it to say %q", tc.name, got, want)
			}
		}
	}
}
