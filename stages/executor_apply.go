package stages

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fluxcd/cli-utils/pkg/object"
	"github.com/fluxcd/pkg/ssa"
	ssautils "github.com/fluxcd/pkg/ssa/utils"
	"golang.org/x/sync/errgroup"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Apply server-side applies objects from a pool of workers. Cluster-wide
// definitions (CRDs, Namespaces) go first, so that the objects that need
// them can be applied in the same stage. Every object is dry-run before any
// is applied, so an invalid object leaves the wave untouched, and every
// object's error is reported.
func (e *Executor) Apply(ctx context.Context, objects []*unstructured.Unstructured, stage string, owner Owner) (*ssa.ChangeSet, error) {
	cs, _, err := e.apply(ctx, objects, stage, owner, nil)
	return cs, err
}

// apply is Apply that also returns the objects as the API server answered
// (see Result.observed), nil unless every object was applied. The
// preflight's answers in dry, when it has some for objects, stand in for
// the dry runs of the objects they are about (DryRuns).
func (e *Executor) apply(ctx context.Context, objects []*unstructured.Unstructured, stage string, owner Owner, dry *DryRuns) (*ssa.ChangeSet, []*unstructured.Unstructured, error) {
	prepared := make([]*unstructured.Unstructured, len(objects))
	var handed *handedAnswers
	if dry.Len() > 0 {
		source := make(map[*unstructured.Unstructured]*unstructured.Unstructured, len(objects))
		handed = &handedAnswers{
			about: func(obj, live *unstructured.Unstructured) *unstructured.Unstructured {
				return dry.answer(stage, source[obj], live, time.Now())
			},
			absent: func(obj *unstructured.Unstructured) bool { return dry.absent(stage, source[obj], time.Now()) },
		}
		for i, obj := range objects {
			prepared[i] = ownedBy(obj, stage, owner)
			source[prepared[i]] = obj
		}
	} else {
		for i, obj := range objects {
			prepared[i] = ownedBy(obj, stage, owner)
		}
	}
	first, rest := splitDefinitions(prepared)
	cs := ssa.NewChangeSet()
	var observed []*unstructured.Unstructured
	stale := false
	for _, wave := range [][]*unstructured.Unstructured{first, rest} {
		if len(wave) == 0 {
			continue
		}
		entries, answered, err := e.applyWave(ctx, wave, owner, handed)
		cs.Append(entries)
		if err != nil {
			return cs, nil, err
		}
		observed = append(observed, answered...)
		if hasCRD(wave) {
			// Wait for the CRDs to be Established before objects of their kinds are applied.
			if err := e.waitEstablished(ctx, wave, owner); err != nil {
				return cs, nil, err
			}
			// The answers predate the wait; the stage's wait looks again.
			stale = true
		}
	}
	if stale {
		return cs, nil, nil
	}
	return cs, observed, nil
}

// ownedBy returns a copy of obj labelled with its deployment and stage.
func ownedBy(obj *unstructured.Unstructured, stage string, owner Owner) *unstructured.Unstructured {
	obj = obj.DeepCopy()
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[OwnerNameLabel] = owner.Name
	labels[OwnerNamespaceLabel] = owner.Namespace
	labels[StageKey] = stage
	obj.SetLabels(labels)
	return obj
}

// Reapply applies one object of a stage again, at once: the correction of
// drift, for an object the stage applied before. One request, after the
// fencing check.
func (e *Executor) Reapply(ctx context.Context, obj *unstructured.Unstructured, stage string, owner Owner) error {
	if err := e.checkFence(ctx, owner); err != nil {
		return fmt.Errorf("apply %s again: %w", ObjectRef(obj), err)
	}
	applied := ownedBy(obj, stage, owner)
	if err := e.client.Patch(ctx, applied, client.Apply, client.ForceOwnership, client.FieldOwner(FieldManager)); err != nil {
		return e.classify(obj, err)
	}
	return nil
}

// crdEstablishTimeout bounds the wait for a stage's CRDs when ctx allows
// longer: the API server establishes a CRD within seconds, and one whose
// names it refuses never, while the apply may run without a deadline.
var crdEstablishTimeout = time.Minute

// waitEstablished waits until the definitions just applied are ready (CRDs
// Established, Namespaces Active). Not ready in time is an error that says
// what is awaited: the objects that need them must not be applied yet.
func (e *Executor) waitEstablished(ctx context.Context, definitions []*unstructured.Unstructured, owner Owner) error {
	ctx, cancel := context.WithTimeout(ctx, crdEstablishTimeout)
	defer cancel()
	checker, err := NewChecker(nil)
	if err != nil {
		return fmt.Errorf("wait for CustomResourceDefinitions: %w", err)
	}
	verdict, err := e.waitUntilReady(ctx, definitions, checker, owner)
	if err != nil {
		return fmt.Errorf("wait for CustomResourceDefinitions: %w", err)
	}
	if !verdict.Ready {
		return fmt.Errorf("wait for CustomResourceDefinitions: %s", verdict.Message)
	}
	return e.waitServed(ctx, definitions)
}

// waitServed waits until the client can map every kind the CRDs define.
// Established does not mean that discovery lists the kind yet, and an
// object applied before it does fails as if its CRD were missing. Discovery
// cannot be watched, so this polls, briefly.
func (e *Executor) waitServed(ctx context.Context, definitions []*unstructured.Unstructured) error {
	for _, crd := range definitions {
		if !isCRD(crd) {
			continue
		}
		group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
		kind, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "kind")
		versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
		for _, v := range versions {
			version, _ := v.(map[string]any)
			name, _ := version["name"].(string)
			if served, _ := version["served"].(bool); !served {
				continue
			}
			gk := schema.GroupKind{Group: group, Kind: kind}
			for delay := 50 * time.Millisecond; ; delay = min(delay*2, time.Second) {
				_, err := e.client.RESTMapper().RESTMapping(gk, name)
				if err == nil {
					break
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("wait for %s to be served: %w", gk.WithVersion(name), err)
				case <-time.After(delay):
				}
			}
		}
	}
	return nil
}

// applyWave applies a wave of objects all or nothing, in as few requests
// as the API server allows:
//
//  1. look: the live objects, one LIST per kind and namespace that holds
//     many of the wave's objects (a GET each for the others);
//  2. every object that exists is checked (is it another deployment's?)
//     and dry-run (is it valid, would the apply change it?);
//  3. only if all of that passed, the new objects are applied; should one
//     of them be refused (invalid), the ones this wave created are deleted
//     again, so that the wave leaves nothing behind;
//  4. then the existing objects that change are applied.
//
// A new object costs its apply, an unchanged one its dry run, a changed
// one both: every object is validated by the server before anything that
// existed is touched. Where handed has the preflight's answer about the
// live object, it stands in for the dry run: an unchanged object then
// costs nothing, a changed one its apply.
func (e *Executor) applyWave(ctx context.Context, objects []*unstructured.Unstructured, owner Owner, handed *handedAnswers) ([]ssa.ChangeSetEntry, []*unstructured.Unstructured, error) {
	ctx, cancel := e.batch(ctx)
	defer cancel()
	entries, observed, err := e.applyWaveWithin(ctx, objects, owner, handed)
	return entries, observed, e.batchCut(ctx, len(objects), err)
}

// batch bounds one batch of API requests by e.batchTimeout, when set.
func (e *Executor) batch(ctx context.Context) (context.Context, context.CancelFunc) {
	if e.batchTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, e.batchTimeout)
}

// batchCut says, of the error of a batch of n objects that its deadline
// cut short, that the cluster did not answer them within spec.timeout;
// the error still wraps the context's, so that it is taken for a
// cluster that does not answer (IsUnanswered), which is retried.
func (e *Executor) batchCut(ctx context.Context, n int, err error) error {
	if err == nil || e.batchTimeout <= 0 || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("the cluster did not answer the apply of %d objects within %s (spec.timeout): %w", n, e.batchTimeout, err)
}

func (e *Executor) applyWaveWithin(ctx context.Context, objects []*unstructured.Unstructured, owner Owner, handed *handedAnswers) ([]ssa.ChangeSetEntry, []*unstructured.Unstructured, error) {
	live, err := e.lookUnlessAbsent(ctx, objects, handed)
	if err != nil {
		return nil, nil, err
	}
	entries := make([]ssa.ChangeSetEntry, len(objects))
	errs := make([]error, len(objects))
	// observed holds each object as the server answered its apply or dry
	// run: what the stage's readiness is decided on first.
	observed := make([]*unstructured.Unstructured, len(objects))
	owners := &ownerLookup{home: e.home}
	var fresh, existing []int
	for i, obj := range objects {
		entries[i] = changeSetEntry(obj)
		if live[i] == nil {
			fresh = append(fresh, i)
			entries[i].Action = ssa.CreatedAction
		} else {
			existing = append(existing, i)
		}
	}
	e.eachOf(existing, func(i int) {
		var answer *unstructured.Unstructured
		if handed != nil {
			answer = handed.about(objects[i], live[i])
		}
		entries[i].Action, observed[i], errs[i] = e.diffLive(ctx, objects[i], live[i], answer, owner, owners)
	})
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}

	e.eachOf(fresh, func(i int) {
		observed[i], entries[i].Action, errs[i] = e.create(ctx, objects[i], owner, owners)
	})
	if err := errors.Join(errs...); err != nil {
		if IsStalled(err) {
			// The source must change before this wave can pass: take back
			// what it created, so that nothing of it stays half applied.
			var created []*unstructured.Unstructured
			for _, i := range fresh {
				if entries[i].Action == ssa.CreatedAction && observed[i] != nil {
					created = append(created, observed[i])
				}
			}
			return nil, nil, errors.Join(err, e.rollback(ctx, created))
		}
		return appliedEntries(entries, errs, fresh), nil, err
	}

	e.eachOf(existing, func(i int) {
		if entries[i].Action != ssa.ConfiguredAction {
			return
		}
		applied := objects[i].DeepCopy()
		if err := e.client.Patch(ctx, applied, client.Apply, client.ForceOwnership, client.FieldOwner(FieldManager)); err != nil {
			errs[i] = e.classify(objects[i], err)
			return
		}
		observed[i] = applied
	})
	if err := errors.Join(errs...); err != nil {
		return appliedEntries(entries, errs, nil), nil, err
	}
	return appliedEntries(entries, errs, nil), observed, nil
}

// handedAnswers are the preflight's dry-run answers for the objects of a
// wave (DryRuns).
type handedAnswers struct {
	// about returns the answer about live for obj, or nil when there is
	// none (DryRuns.answer).
	about func(obj, live *unstructured.Unstructured) *unstructured.Unstructured
	// absent reports whether the preflight found no obj (DryRuns.absent).
	absent func(obj *unstructured.Unstructured) bool
}

// lookUnlessAbsent is look for the objects of a wave that the preflight
// did not find absent: those it did are taken for new without a request,
// which saves a fleet of new deployments in one namespace a GET per
// object (the LIST of a kind there holds every other deployment's
// objects, so the look reads a wave's objects one by one).
func (e *Executor) lookUnlessAbsent(ctx context.Context, objects []*unstructured.Unstructured, handed *handedAnswers) ([]*unstructured.Unstructured, error) {
	if handed == nil {
		return e.look(ctx, objects)
	}
	var idx []int
	var rest []*unstructured.Unstructured
	for i, obj := range objects {
		if !handed.absent(obj) {
			idx = append(idx, i)
			rest = append(rest, obj)
		}
	}
	live := make([]*unstructured.Unstructured, len(objects))
	if len(rest) == 0 {
		return live, nil
	}
	found, err := e.look(ctx, rest)
	for j, i := range idx {
		live[i] = found[j]
	}
	return live, err
}

// appliedEntries keeps the entries of the objects whose apply did not fail
// (an object whose apply failed was not created or configured), of only
// the objects at the indices of only, when it is not nil.
func appliedEntries(entries []ssa.ChangeSetEntry, errs []error, only []int) []ssa.ChangeSetEntry {
	kept := make([]ssa.ChangeSetEntry, 0, len(entries))
	keep := func(i int) {
		if errs[i] == nil && entries[i].Action != "" {
			kept = append(kept, entries[i])
		}
	}
	if only != nil {
		for _, i := range only {
			keep(i)
		}
		return kept
	}
	for i := range entries {
		keep(i)
	}
	return kept
}

func changeSetEntry(obj *unstructured.Unstructured) ssa.ChangeSetEntry {
	return ssa.ChangeSetEntry{
		ObjMetadata:  object.UnstructuredToObjMetadata(obj),
		GroupVersion: obj.GroupVersionKind().Version,
		Subject:      ssautils.FmtUnstructured(obj),
	}
}

// create applies an object the look found absent. It applies without
// force: should the object have been created meanwhile by someone else,
// with other values, the apply conflicts instead of taking it over, and
// the object goes the way of one that existed (diff, then apply). It
// returns the object as the last apply answered and the action taken:
// CreatedAction only for an object this apply created.
func (e *Executor) create(ctx context.Context, obj *unstructured.Unstructured, owner Owner, owners *ownerLookup) (*unstructured.Unstructured, ssa.Action, error) {
	applied := obj.DeepCopy()
	err := e.client.Patch(ctx, applied, client.Apply, client.FieldOwner(FieldManager))
	if err == nil {
		if len(applied.GetManagedFields()) > 1 {
			// Someone else wrote it meanwhile, with the same values: the
			// apply shared their fields. Look at it as at one that existed.
			return applied, ssa.UnchangedAction, e.lateCheck(ctx, obj, applied, owner, owners)
		}
		return applied, ssa.CreatedAction, nil
	}
	if !apierrors.IsConflict(err) {
		return nil, "", e.classify(obj, err)
	}
	entry, err := e.diff(ctx, obj, owner, owners)
	if err != nil || (entry.Action != ssa.CreatedAction && entry.Action != ssa.ConfiguredAction) {
		return nil, entry.Action, err
	}
	applied = obj.DeepCopy()
	if err := e.client.Patch(ctx, applied, client.Apply, client.ForceOwnership, client.FieldOwner(FieldManager)); err != nil {
		return nil, "", e.classify(obj, err)
	}
	return applied, entry.Action, nil
}

// lateCheck runs the ownership check on an object that appeared between
// the look and the apply. The apply changed none of its data (it would
// have conflicted otherwise), only Capstan's labels; a refusal is
// reported like any other.
func (e *Executor) lateCheck(ctx context.Context, obj, applied *unstructured.Unstructured, owner Owner, owners *ownerLookup) error {
	before := applied.DeepCopy()
	labels := before.GetLabels()
	delete(labels, OwnerNameLabel)
	delete(labels, OwnerNamespaceLabel)
	delete(labels, StageKey)
	before.SetLabels(labels)
	return owners.check(ctx, obj, before, owner)
}

// rollback deletes the objects a failed wave created, each only if it is
// still the object created (its UID).
func (e *Executor) rollback(ctx context.Context, created []*unstructured.Unstructured) error {
	var mu sync.Mutex
	var errs []error
	var g errgroup.Group
	g.SetLimit(e.concurrency)
	for _, obj := range created {
		g.Go(func() error {
			uid := obj.GetUID()
			err := e.client.Delete(ctx, obj, client.Preconditions{UID: &uid}, client.PropagationPolicy(metav1.DeletePropagationBackground))
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				mu.Lock()
				errs = append(errs, fmt.Errorf("remove %s, created by this failed attempt: %w", ObjectRef(obj), err))
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait()
	return errors.Join(errs...)
}

// changes reports whether dryRun, the result of applying to live, differs
// from it: in labels, annotations (withMeta) or anything but metadata and
// status.
func changes(live, dryRun *unstructured.Unstructured, withMeta bool) bool {
	if withMeta && (!apiequality.Semantic.DeepEqual(live.GetLabels(), dryRun.GetLabels()) ||
		!apiequality.Semantic.DeepEqual(live.GetAnnotations(), dryRun.GetAnnotations())) {
		return true
	}
	strip := func(u *unstructured.Unstructured) map[string]any {
		c := make(map[string]any, len(u.Object))
		for k, v := range u.Object {
			if k != "metadata" && k != "status" {
				c[k] = v
			}
		}
		return c
	}
	return !apiequality.Semantic.DeepEqual(strip(live), strip(dryRun))
}
