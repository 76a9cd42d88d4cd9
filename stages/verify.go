package stages

import (
	"context"
	"errors"

	"github.com/fluxcd/pkg/ssa"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Verify looks, without changing anything, at what applying objects again
// as stage applies them for owner (its labels, its fields forced) would do:
// an object missing is CreatedAction, one the apply would change
// ConfiguredAction, the others UnchangedAction, in the order of objects.
// Each object that exists is checked for ownership first, as an apply
// checks it. It costs a LIST per kind and namespace that holds many of
// them, selected by owner's labels (a GET each for the others, and for
// those the LIST misses), and a server-side dry run per object that
// exists.
//
// It is how Capstan finds what changed while it did not watch (the drift
// watch judges only the writes it sees): once per deployment after a
// start, a new leader or a handover. A cluster that does not answer is an
// UnreachableError.
func (e *Executor) Verify(ctx context.Context, objects []*unstructured.Unstructured, stage string, owner Owner) ([]ssa.ChangeSetEntry, error) {
	if e.cluster != nil {
		if err := e.cluster.CheckAvailable(ctx); err != nil {
			return nil, &UnreachableError{Cluster: e.cluster.Name(), Err: err}
		}
	}
	prepared := make([]*unstructured.Unstructured, len(objects))
	for i, obj := range objects {
		prepared[i] = ownedBy(obj, stage, owner)
	}
	live, err := e.lookOwned(ctx, prepared, owner)
	if err != nil {
		return nil, err
	}
	entries := make([]ssa.ChangeSetEntry, len(prepared))
	errs := make([]error, len(prepared))
	owners := &ownerLookup{home: e.home}
	e.each(prepared, func(i int, obj *unstructured.Unstructured) {
		entries[i] = changeSetEntry(obj)
		if live[i] == nil {
			entries[i].Action = ssa.CreatedAction
			return
		}
		entries[i].Action, _, errs[i] = e.diffLive(ctx, obj, live[i], nil, owner, owners)
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return entries, nil
}
