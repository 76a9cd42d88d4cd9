package stages

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// DryRuns keeps the API server's answers to the server-side dry-run
// applies Preflight sends for one revision's plan, so that the apply of
// each stage need not send them again: an object that exists and that the
// dry run showed unchanged then costs no request at the apply, and one
// that changes costs its apply alone.
//
// An answer is used only for the object of the plan it was sent for, in
// the stage it was sent as, and only while the live object the apply
// finds is the one the dry run was applied to: the same UID and
// resourceVersion. Anything written to the object since, or an answer
// older than dryRunMaxAge, and the executor asks the server again, as
// without answers. Keep one DryRuns with the plan it was filled for
// (Plan.DryRuns): a new revision or spec makes a new plan.
type DryRuns struct {
	mu      sync.Mutex
	answers map[dryRunKey]dryRunAnswer
}

// dryRunKey is one object of the plan (its identity in the revision's
// render) as one stage applies it.
type dryRunKey struct {
	stage  string
	object *unstructured.Unstructured
}

type dryRunAnswer struct {
	obj   *unstructured.Unstructured
	taken time.Time
	// live marks an answer no dry run gave: the object was known to be as
	// Capstan's last apply of the same content left it (keepLive), so the
	// live object, while it is that one, is the answer.
	live bool
	// absent marks the answer about an object that did not exist: obj is
	// nil, and the apply creates it without looking for it (absent).
	absent bool
}

// dryRunMaxAge bounds how long an answer is trusted. The resourceVersion
// says that the object did not change, not that the server would admit it
// the same way (an admission webhook someone installed meanwhile): a
// stage that starts longer than this after the preflight dry-runs its
// objects again.
const dryRunMaxAge = 10 * time.Minute

// keep records the answer to the dry run of obj (an object of the plan)
// as stage applies it. Of an object that did not exist (no
// resourceVersion) it records only that (absent).
func (d *DryRuns) keep(stage string, obj, answer *unstructured.Unstructured, now time.Time) {
	if d == nil {
		return
	}
	if answer.GetResourceVersion() == "" {
		// The object does not exist: the apply may create it without
		// reading it first (absent). The answer itself is not needed.
		d.put(dryRunKey{stage: stage, object: obj}, dryRunAnswer{taken: now, absent: true})
		return
	}
	// Kept until the plan goes (its deployment Ready): what the apply
	// compares and the readiness checks read, not who manages which field.
	answer.SetManagedFields(nil)
	d.put(dryRunKey{stage: stage, object: obj}, dryRunAnswer{obj: answer, taken: now})
}

// keepLive records that obj (an object of the plan), as stage applies it,
// is as Capstan's last apply of the same content left it while the live
// object has uid and resourceVersion (PreflightOptions.Unchanged): its dry
// run would answer the live object itself, so none was sent. The apply
// takes the live object as the answer while it is that one, and otherwise
// goes its normal way.
func (d *DryRuns) keepLive(stage string, obj *unstructured.Unstructured, uid types.UID, resourceVersion string, now time.Time) {
	if d == nil || resourceVersion == "" || uid == "" {
		return
	}
	known := &unstructured.Unstructured{Object: map[string]any{}}
	known.SetUID(uid)
	known.SetResourceVersion(resourceVersion)
	d.put(dryRunKey{stage: stage, object: obj}, dryRunAnswer{obj: known, taken: now, live: true})
}

// answer returns the kept answer for obj as stage applies it, when it is
// about live, the object as the apply's look found it; nil otherwise.
func (d *DryRuns) answer(stage string, obj, live *unstructured.Unstructured, now time.Time) *unstructured.Unstructured {
	if d == nil || live == nil {
		return nil
	}
	d.mu.Lock()
	a, ok := d.answers[dryRunKey{stage: stage, object: obj}]
	d.mu.Unlock()
	if !ok || a.absent || now.Sub(a.taken) > dryRunMaxAge {
		return nil
	}
	if a.obj.GetResourceVersion() != live.GetResourceVersion() || a.obj.GetUID() != live.GetUID() {
		return nil
	}
	if a.live {
		return live
	}
	return a.obj
}

// absent reports whether the preflight's dry run of obj, as stage applies
// it, found no such object, recently enough to be trusted (absentMaxAge).
// The apply then creates it without a GET or LIST first. Its create
// applies without force: an object another writer created since, with
// other values, conflicts and goes the way of one that existed, and one
// with the same values shows in the answer's managed fields
// (Executor.create).
func (d *DryRuns) absent(stage string, obj *unstructured.Unstructured, now time.Time) bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	a, ok := d.answers[dryRunKey{stage: stage, object: obj}]
	d.mu.Unlock()
	return ok && a.absent && now.Sub(a.taken) <= absentMaxAge
}

// absentMaxAge bounds how long an answer that an object does not exist
// is trusted. Nothing proves it still holds (an answer about an object
// that exists is checked against the live resourceVersion): it bounds the
// window in which two deployments that declare one object both create it
// without seeing each other's (docs/decisions.md, "The apply looks only
// for what the preflight found"). The stages applied right after the
// preflight are within it; a stage that starts after a long wait looks.
const absentMaxAge = time.Minute

// allAbsent reports whether the preflight found every one of objects, as
// stage applies them, absent (and there is at least one).
func (d *DryRuns) allAbsent(stage string, objects []*unstructured.Unstructured, now time.Time) bool {
	for _, obj := range objects {
		if !d.absent(stage, obj, now) {
			return false
		}
	}
	return len(objects) > 0
}

func (d *DryRuns) put(k dryRunKey, a dryRunAnswer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.answers == nil {
		d.answers = map[dryRunKey]dryRunAnswer{}
	}
	d.answers[k] = a
}

// Len is how many answers d keeps.
func (d *DryRuns) Len() int {
	if d == nil {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.answers)
}

// ChangesAdmission reports whether applying obj can change how the API
// server admits, defaults or validates other objects: a dry run sent
// before it was applied does not tell what an apply after it does.
func ChangesAdmission(obj *unstructured.Unstructured) bool {
	gk := obj.GroupVersionKind().GroupKind()
	switch gk {
	case schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"},
		schema.GroupKind{Group: "apiregistration.k8s.io", Kind: "APIService"}:
		return true
	}
	return gk.Group == "admissionregistration.k8s.io"
}
