package stages

import (
	"context"
	"errors"
	"sync"

	"github.com/fluxcd/pkg/ssa"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// lookListMin is how many objects of one kind in one namespace a wave
// needs before their live state is read with a LIST rather than a GET
// each.
const lookListMin = 8

// lookPageSize bounds a LIST page of the look, and so the memory it holds
// at once: objects of the kind that the wave does not declare are dropped
// page by page.
const lookPageSize = 500

// lookListShare bounds what a LIST may read for a group: when the kind's
// objects in the namespace outnumber the group's this many times (a fleet
// of deployments in one namespace), the rest of the group is read with a
// GET each instead.
const lookListShare = 4

// look returns the live object of each of objects, nil where there is none.
func (e *Executor) look(ctx context.Context, objects []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	return e.lookBy(ctx, objects, nil)
}

// lookOwned is look for objects owner applied: their LISTs select them by
// the owner labels Capstan applies with them, so that a namespace holding
// many more objects of the kind (a fleet of deployments) costs one LIST
// per kind rather than a GET per object. An object the LIST misses
// (deleted, or its labels removed by hand) is read with a GET.
func (e *Executor) lookOwned(ctx context.Context, objects []*unstructured.Unstructured, owner Owner) ([]*unstructured.Unstructured, error) {
	return e.lookBy(ctx, objects, client.MatchingLabels{OwnerNameLabel: owner.Name, OwnerNamespaceLabel: owner.Namespace})
}

// lookBy is look, its LISTs narrowed by selector when it is set.
func (e *Executor) lookBy(ctx context.Context, objects []*unstructured.Unstructured, selector client.MatchingLabels) ([]*unstructured.Unstructured, error) {
	live := make([]*unstructured.Unstructured, len(objects))
	groups := map[groupKey][]int{}
	var keys []groupKey
	for i, obj := range objects {
		k := groupKey{gvk: obj.GroupVersionKind(), namespace: obj.GetNamespace()}
		if groups[k] == nil {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], i)
	}
	// Small groups are read a GET each, together; the others a LIST each.
	var (
		mu   sync.Mutex
		errs []error
		g    errgroup.Group
	)
	each := map[string]int{}
	for _, k := range keys {
		idx := groups[k]
		if len(idx) < lookListMin {
			for _, i := range idx {
				each[ObjectRef(objects[i])] = i
			}
			continue
		}
		g.Go(func() error {
			if err := e.lookList(ctx, k, idx, objects, live, selector); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			return nil
		})
	}
	err := e.lookRest(ctx, each, objects, live)
	_ = g.Wait()
	return live, errors.Join(append(errs, err)...)
}

// lookList reads the live objects of one group (the objects at idx) with a
// paged LIST of their kind in their namespace. The first page holds a few
// times the group; when the kind has many more objects there than that,
// the objects not seen on it are read with a GET each (lookRest), so that
// a stage among thousands of other objects does not read them all. With
// a selector, the LIST reads only the objects it selects, every page of
// them; those it does not hold are read with a GET each.
func (e *Executor) lookList(ctx context.Context, k groupKey, idx []int, objects, live []*unstructured.Unstructured, selector client.MatchingLabels) error {
	want := make(map[string]int, len(idx))
	for _, i := range idx {
		want[objects[i].GetName()] = i
	}
	opts := []client.ListOption{client.Limit(int64(min(lookListShare*len(idx), lookPageSize)))}
	if k.namespace != "" {
		opts = append(opts, client.InNamespace(k.namespace))
	}
	if selector != nil {
		opts[0] = client.Limit(lookPageSize)
		opts = append(opts, selector)
	}
	for cont := ""; ; {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(k.gvk.GroupVersion().WithKind(k.gvk.Kind + "List"))
		if err := e.client.List(ctx, list, append(opts, client.Continue(cont))...); err != nil {
			return e.classify(objects[idx[0]], err)
		}
		for j := range list.Items {
			if i, ok := want[list.Items[j].GetName()]; ok {
				live[i] = &list.Items[j]
				delete(want, list.Items[j].GetName())
			}
		}
		if cont = list.GetContinue(); len(want) == 0 {
			return nil
		}
		if cont == "" {
			if selector != nil {
				return e.lookRest(ctx, want, objects, live)
			}
			return nil
		}
		if remaining := list.GetRemainingItemCount(); selector == nil && (remaining == nil || *remaining > int64(lookListShare*len(idx))) {
			return e.lookRest(ctx, want, objects, live)
		}
		opts[0] = client.Limit(lookPageSize)
	}
}

// lookRest reads the objects at the indices of want (its values) with a
// GET each.
func (e *Executor) lookRest(ctx context.Context, want map[string]int, objects, live []*unstructured.Unstructured) error {
	var (
		mu   sync.Mutex
		errs []error
	)
	var g errgroup.Group
	g.SetLimit(e.concurrency)
	for _, i := range want {
		g.Go(func() error {
			obj := &unstructured.Unstructured{}
			obj.SetGroupVersionKind(objects[i].GroupVersionKind())
			err := e.client.Get(ctx, client.ObjectKeyFromObject(objects[i]), obj)
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				mu.Lock()
				errs = append(errs, e.classify(objects[i], err))
				mu.Unlock()
			default:
				live[i] = obj
			}
			return nil
		})
	}
	_ = g.Wait()
	return errors.Join(errs...)
}

// diffLive decides for an object that exists (live) whether owner may
// apply it (checkOwner) and whether the apply changes it, by a server-side
// dry run, which also validates it. answer, when set, is the preflight's
// dry run about this very live object (DryRuns.answer): it stands in for
// the request.
//
// It returns the dry run's answer, which is the object as it is when the
// apply changes nothing.
func (e *Executor) diffLive(ctx context.Context, obj, live, answer *unstructured.Unstructured, owner Owner, owners *ownerLookup) (ssa.Action, *unstructured.Unstructured, error) {
	if err := owners.check(ctx, obj, live, owner); err != nil {
		return "", nil, err
	}
	dryRun := answer
	if dryRun == nil {
		dryRun = obj.DeepCopy()
		if err := e.client.Patch(ctx, dryRun, client.Apply, client.DryRunAll, client.ForceOwnership, client.FieldOwner(FieldManager)); err != nil {
			return "", nil, e.classify(obj, err)
		}
	}
	if changes(live, dryRun, true) {
		return ssa.ConfiguredAction, nil, nil
	}
	return ssa.UnchangedAction, dryRun, nil
}

// diff looks at what applying obj would do: a server-side dry-run first
// (which also validates it), then, only for an object that exists, a GET
// of the live object, which decides whether owner may apply it
// (checkOwner) and whether the apply changes it. A new object costs one
// request here.
func (e *Executor) diff(ctx context.Context, obj *unstructured.Unstructured, owner Owner, owners *ownerLookup) (ssa.ChangeSetEntry, error) {
	entry := changeSetEntry(obj)
	dryRun := obj.DeepCopy()
	if err := e.client.Patch(ctx, dryRun, client.Apply, client.DryRunAll, client.ForceOwnership, client.FieldOwner(FieldManager)); err != nil {
		return entry, e.classify(obj, err)
	}
	if dryRun.GetResourceVersion() == "" {
		entry.Action = ssa.CreatedAction
		return entry, nil
	}
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(obj.GroupVersionKind())
	if err := e.client.Get(ctx, client.ObjectKeyFromObject(obj), live); err != nil {
		if apierrors.IsNotFound(err) {
			// Deleted since the dry run: the apply creates it.
			entry.Action = ssa.CreatedAction
			return entry, nil
		}
		return entry, e.classify(obj, err)
	}
	if err := owners.check(ctx, obj, live, owner); err != nil {
		return entry, err
	}
	if changes(live, dryRun, true) {
		entry.Action = ssa.ConfiguredAction
	} else {
		entry.Action = ssa.UnchangedAction
	}
	return entry, nil
}
