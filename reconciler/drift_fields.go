package reconciler

import (
	"bytes"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	"github.com/capstan-dev/capstan/stages"
)

// fieldsDrift says what happened to the fields Capstan applied to an
// object between oldObj and newObj, its metadata before and after one
// write, worded for events after "was"; "" when that write is no drift.
//
// Another writer changes Capstan's fields without touching the time of
// Capstan's managed-fields entry, which only Capstan's apply sets: the
// entry loses fields while its time stays. Those fields were either taken
// over (another manager owns them now: an update such as kubectl edit, or
// an apply with force) or removed (nobody owns them: an update that only
// deleted a data key, a label or an annotation, whose writer is left
// owning no field and so has no entry to name it by). Fields Capstan's
// other managers (capstan-scale, capstan-rollout) took are the plan at
// work, not drift. Capstan's own apply updates the time; two applies
// within one second that shrink the entry look like a removal and cost
// one more apply.
func fieldsDrift(oldObj, newObj any) string {
	o, ok1 := oldObj.(*metav1.PartialObjectMetadata)
	n, ok2 := newObj.(*metav1.PartialObjectMetadata)
	if !ok1 || !ok2 || o.ResourceVersion == n.ResourceVersion {
		return ""
	}
	before, after := appliedEntry(o), appliedEntry(n)
	switch {
	case before == nil:
		return ""
	case after != nil && fieldsEqual(before.FieldsV1, after.FieldsV1):
		return ""
	case after != nil && !timeEqual(before.Time, after.Time):
		return "" // Capstan applied
	}
	lost := fieldSet(before)
	if after != nil {
		lost = lost.Difference(fieldSet(after))
	}
	if lost.Empty() {
		return "" // Capstan's entry only grew: Capstan applied within the second
	}
	removed, taker := lost, ""
	var takenAt *metav1.Time
	for i := range n.ManagedFields {
		mf := &n.ManagedFields[i]
		if mf == after || mf.Subresource != "" {
			continue
		}
		owned := fieldSet(mf)
		if lost.Intersection(owned).Empty() {
			continue
		}
		removed = removed.Difference(owned)
		if !strings.HasPrefix(mf.Manager, stages.FieldManager) && (taker == "" || newer(mf.Time, takenAt)) {
			taker, takenAt = mf.Manager, mf.Time
		}
	}
	switch {
	case taker != "":
		return "changed by " + taker
	case removed.Empty():
		return "" // Capstan's other managers took them
	}
	if who := writerOf(o, n); who != "" {
		return fmt.Sprintf("changed: %s removed by %s", describeFields(removed), who)
	}
	return fmt.Sprintf("changed: %s removed by a writer that kept no field of the object, so no field manager is left to name", describeFields(removed))
}

// writerOf returns the manager, not one of Capstan's, whose entry the
// write from o to n added or changed (the newest when several did), or ""
// when none did: the writer owns no field any more.
func writerOf(o, n *metav1.PartialObjectMetadata) string {
	type entryKey struct{ manager, operation, subresource string }
	was := map[entryKey]*metav1.ManagedFieldsEntry{}
	for i := range o.ManagedFields {
		mf := &o.ManagedFields[i]
		was[entryKey{mf.Manager, string(mf.Operation), mf.Subresource}] = mf
	}
	var who string
	var when *metav1.Time
	for i := range n.ManagedFields {
		mf := &n.ManagedFields[i]
		if mf.Subresource != "" || strings.HasPrefix(mf.Manager, stages.FieldManager) {
			continue
		}
		if old := was[entryKey{mf.Manager, string(mf.Operation), ""}]; old != nil &&
			timeEqual(old.Time, mf.Time) && fieldsEqual(old.FieldsV1, mf.FieldsV1) {
			continue
		}
		if who == "" || newer(mf.Time, when) {
			who, when = mf.Manager, mf.Time
		}
	}
	return who
}

// describeFields names the fields of set for an event: "a field Capstan
// manages (.data.k) was", with at most three paths named.
func describeFields(set *fieldpath.Set) string {
	leaves := set.Leaves()
	if leaves.Empty() {
		leaves = set
	}
	var paths []string
	for p := range leaves.All() {
		paths = append(paths, p.String())
	}
	named := strings.Join(paths[:min(3, len(paths))], ", ")
	if len(paths) > 3 {
		named += fmt.Sprintf(" and %d more", len(paths)-3)
	}
	if len(paths) == 1 {
		return "a field Capstan manages (" + named + ") was"
	}
	return "fields Capstan manages (" + named + ") were"
}

// fieldSet decodes the fields of a managed-fields entry; an entry the API
// server wrote always decodes, so a broken one counts as owning nothing.
func fieldSet(mf *metav1.ManagedFieldsEntry) *fieldpath.Set {
	set := &fieldpath.Set{}
	if mf.FieldsV1 != nil {
		if err := set.FromJSON(bytes.NewReader(mf.FieldsV1.Raw)); err != nil {
			return &fieldpath.Set{}
		}
	}
	return set
}

// newer reports whether a is after b; a time is newer than none.
func newer(a, b *metav1.Time) bool {
	return a != nil && (b == nil || b.Before(a))
}

func fieldsEqual(a, b *metav1.FieldsV1) bool {
	if a == nil || b == nil {
		return a == b
	}
	return bytes.Equal(a.Raw, b.Raw)
}

func timeEqual(a, b *metav1.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(b)
}

// appliedEntry returns the managed-fields entry of Capstan's apply to the
// object itself (not a subresource), or nil.
func appliedEntry(obj *metav1.PartialObjectMetadata) *metav1.ManagedFieldsEntry {
	for i, mf := range obj.ManagedFields {
		if mf.Manager == stages.FieldManager && mf.Operation == metav1.ManagedFieldsOperationApply && mf.Subresource == "" {
			return &obj.ManagedFields[i]
		}
	}
	return nil
}
