package reconciler

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// Finalizer holds a ClusterDeployment until what it applied is deleted
// (deletionPolicy Delete) or let go (Orphan).
const Finalizer = "capstan.dev/finalizer"

// pruneRetry is how soon a prune waiting for objects to go looks again.
const pruneRetry = 2 * time.Second

// recordInventory adds what an apply stage applied to the inventory.
func recordInventory(cd *capstanv1.ClusterDeployment, exec *stages.Executor, stage *stages.Stage, plan *stages.Plan) {
	if stage.Action != capstanv1.StageActionApply && stage.Action != "" {
		return
	}
	if cd.Status.Inventory == nil {
		cd.Status.Inventory = &capstanv1.Inventory{}
	}
	stages.MergeInventory(cd.Status.Inventory, exec.InventoryOf(stage), plan.Names())
}

// executorForInventory returns the executor on the cluster an inventory
// stage's objects were applied to.
func (r *Reconciler) executorForInventory(ctx context.Context, cd *capstanv1.ClusterDeployment, s capstanv1.InventoryStage) (*stages.Executor, error) {
	if s.KubeConfig == nil {
		return r.local(cd)
	}
	key, err := inventoryKey(cd, s, r.clusters.rules)
	if err != nil {
		return nil, err
	}
	return r.executorVia(ctx, cd, key)
}

// pruneResult is where one pass of removing inventory objects got.
type pruneResult struct {
	// waiting says what the pass waits for; empty when it is done.
	waiting string
	// held lists the objects left in place because some of them are of
	// destructive kinds that may not be deleted.
	held []string
	// destructive lists, of held, those of destructive kinds.
	destructive []string
	// orphaned lists stages left because their cluster cannot be reached.
	orphaned []string
	// refused lists, as "stage: why", stages left because their record
	// names a kubeconfig the deployment may not use (another namespace's,
	// or one that is refused).
	refused []string
}

// removeStale deletes the inventory objects of groups, in reverse group
// order, one group at a time: a group's objects must be gone before the
// group before it is touched. Objects gone, kept by capstan.dev/prune:
// disabled or no longer this deployment's leave the inventory.
//
// When some of the objects are of destructive kinds and the deployment
// does not allow deleting those, nothing is deleted: deleting the
// templates and Secrets of a Cluster that stays would break it. The
// objects are returned as held, and stay in the inventory.
//
// A group whose cluster cannot be reached waits, unless orphanUnreachable
// (a deployment being deleted, whose cluster may be gone for good): then
// its objects are left and the group is returned as orphaned. A group
// whose kubeconfig is refused (stalled: another namespace's Secret, a
// refused field) stalls a prune; a deletion leaves its objects and
// returns it as refused, so that a tampered status cannot hold the
// deployment's finalizer forever.
func (r *Reconciler) removeStale(ctx context.Context, cd *capstanv1.ClusterDeployment, groups []capstanv1.InventoryStage, why string, orphanUnreachable bool) (pruneResult, error) {
	owner := stages.Owner{Name: cd.Name, Namespace: cd.Namespace}
	opts := stages.PruneOptions{Destructive: cd.Spec.Prune != nil && cd.Spec.Prune.Destructive}
	var out pruneResult
	execs := make([]*stages.Executor, len(groups))
	for i, g := range groups {
		exec, err := r.executorForInventory(ctx, cd, g)
		switch {
		case stages.IsUnreachable(err) && orphanUnreachable:
			out.orphaned = append(out.orphaned, g.Name)
			stages.RemoveFromInventory(cd.Status.Inventory, stages.InventoryIDs(&capstanv1.Inventory{Stages: []capstanv1.InventoryStage{g}}))
		case stages.IsUnreachable(err):
			out.waiting = fmt.Sprintf("%s: stage %s: %v", why, g.Name, err)
			return out, nil
		case stages.IsStalled(err) && orphanUnreachable:
			out.refused = append(out.refused, g.Name+": "+err.Error())
			stages.RemoveFromInventory(cd.Status.Inventory, stages.InventoryIDs(&capstanv1.Inventory{Stages: []capstanv1.InventoryStage{g}}))
		case err != nil:
			return out, err
		}
		execs[i] = exec
	}
	leave := func(res stages.PruneResult) {
		ids := map[string]bool{}
		for _, id := range slices.Concat(res.Gone, res.Kept, slices.Collect(maps.Keys(res.Protected))) {
			ids[id] = true
		}
		stages.RemoveFromInventory(cd.Status.Inventory, ids)
		for _, id := range res.Kept {
			r.event(cd, "Normal", "PruneSkipped", "%s: kept, it is marked %s: disabled", stages.EntryRef(id), stages.PruneKey)
		}
		for _, id := range slices.Sorted(maps.Keys(res.Protected)) {
			r.event(cd, "Warning", "PruneSkipped", "%s: kept, Capstan never deletes it: %s; delete it by hand if it must go", stages.EntryRef(id), res.Protected[id])
		}
	}
	if !opts.Destructive && slices.ContainsFunc(groups, func(g capstanv1.InventoryStage) bool { return stages.AnyDestructive(g.Entries) }) {
		// Look first: delete nothing if a destructive object must stay.
		var held, rest []string
		for i, g := range groups {
			if execs[i] == nil {
				continue
			}
			look := opts
			look.DryRun = true
			res, err := execs[i].Prune(ctx, g.Entries, owner, look)
			leave(res)
			if err != nil {
				return out, fmt.Errorf("%s: %w", why, err)
			}
			held, rest = append(held, res.Held...), append(rest, res.Deleting...)
		}
		if len(held) > 0 {
			slices.Sort(held)
			out.destructive = held
			out.held = slices.Sorted(slices.Values(slices.Concat(held, rest)))
			return out, nil
		}
	}
	for i, g := range slices.Backward(groups) {
		if execs[i] == nil {
			continue
		}
		res, err := execs[i].Prune(ctx, g.Entries, owner, opts)
		leave(res)
		if err != nil {
			return out, fmt.Errorf("%s: %w", why, err)
		}
		if !res.Done() {
			refs := make([]string, len(res.Deleting))
			for i, id := range res.Deleting {
				refs[i] = stages.EntryRef(id)
			}
			out.waiting = fmt.Sprintf("%s: stage %s: waiting for %d objects to be deleted: %s",
				why, g.Name, len(refs), strings.Join(refs, ", "))
			return out, nil
		}
	}
	return out, nil
}

func refs(ids []string) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = stages.EntryRef(id)
	}
	return strings.Join(out, ", ")
}

// prune deletes what the inventory holds and the plan no longer applies,
// once every stage of the plan is Ready. It reports whether the prune is
// done; when not, status says what it waits for and the walk comes back.
func (r *Reconciler) prune(ctx context.Context, a *attempt) (bool, error) {
	cd := a.cd
	inv := cd.Status.Inventory
	if inv == nil {
		return true, nil
	}
	res, err := r.removeStale(ctx, cd, stages.Stale(inv, a.plan), "prune", false)
	if !slices.Equal(inv.PendingPrune, res.held) && len(res.held) > 0 {
		r.event(cd, "Warning", "PrunePending", "kept %d objects the source no longer declares, because %s %s of a destructive kind; "+
			"set spec.prune.destructive: true to delete them, or label the live ones %s: disabled to keep them: %s",
			len(res.held), refs(res.destructive), isAre(len(res.destructive)), stages.PruneKey, refs(res.held))
	}
	inv.PendingPrune = res.held
	if err == nil && res.waiting != "" {
		setCondition(cd, capstanv1.ConditionReady, false, ReasonPruning, res.waiting)
		setCondition(cd, capstanv1.ConditionReconciling, true, ReasonPruning, res.waiting)
		a.requeue = pruneRetry
	}
	if perr := r.saveStatus(ctx, a); perr != nil {
		return false, perr
	}
	if err != nil {
		return false, err
	}
	return res.waiting == "", nil
}

// lettingGo reports whether deleting cd must leave what it applied: its
// policy says so, or the deployment lives in another cluster now (a
// mirror, or one in the middle of a move).
func lettingGo(cd *capstanv1.ClusterDeployment) bool {
	return cd.Spec.DeletionPolicy == capstanv1.DeletionPolicyOrphan ||
		cd.Annotations[pivot.MirrorAnnotation] != "" || pivoting(cd)
}

// ensureFinalizer adds the finalizer to a deployment that does not have it.
func (r *Reconciler) ensureFinalizer(ctx context.Context, cd *capstanv1.ClusterDeployment) error {
	if controllerutil.ContainsFinalizer(cd, Finalizer) {
		return nil
	}
	patch := client.MergeFrom(cd.DeepCopy())
	controllerutil.AddFinalizer(cd, Finalizer)
	if err := r.client.Patch(ctx, cd, patch); err != nil {
		return fmt.Errorf("add finalizer to ClusterDeployment %s/%s: %w", cd.Namespace, cd.Name, err)
	}
	return nil
}

// finalize carries out the deletion policy of a deployment being deleted,
// then lets it go. With Delete, its objects go in reverse stage order,
// each stage's gone before the next; destructive ones without
// spec.prune.destructive are left, and an event names them.
func (r *Reconciler) finalize(ctx context.Context, cd *capstanv1.ClusterDeployment) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(cd, Finalizer) {
		r.forget(cd.Namespace, cd.Name)
		return reconcile.Result{}, nil
	}
	if !lettingGo(cd) && cd.Status.Inventory != nil && len(cd.Status.Inventory.Stages) > 0 {
		before := cd.DeepCopy()
		res, err := r.removeStale(ctx, cd, cd.Status.Inventory.Stages, "delete", true)
		if err == nil && res.waiting != "" {
			setCondition(cd, capstanv1.ConditionReady, false, ReasonDeleting, res.waiting)
		}
		if perr := r.patchStatus(ctx, before, cd); perr != nil {
			return reconcile.Result{}, perr
		}
		switch {
		case err != nil && r.lockedOut(ctx, cd, err):
			// The namespace goes, and the ServiceAccount's permissions
			// with it: waiting would hold the namespace forever.
			r.event(cd, "Warning", "Orphaned", "left the objects it applied: namespace %s is being deleted, and ServiceAccount %s may no longer delete them",
				cd.Namespace, r.actorOf(cd))
		case err != nil:
			log.FromContext(ctx).Error(err, "delete the deployment's objects")
			r.event(cd, "Warning", "DeleteFailed", "%v", err)
			return reconcile.Result{RequeueAfter: r.backoff(r.failures.inc(client.ObjectKeyFromObject(cd)))}, nil
		}
		if res.waiting != "" {
			return reconcile.Result{RequeueAfter: pruneRetry}, nil
		}
		if len(res.held) > 0 {
			r.event(cd, "Warning", "Orphaned", "left the %d objects it applied, because %s %s of a destructive kind and spec.prune.destructive is not set",
				len(res.held), refs(res.destructive), isAre(len(res.destructive)))
		}
		for _, stage := range res.orphaned {
			r.event(cd, "Warning", "Orphaned", "left the objects of stage %s: its cluster cannot be reached", stage)
		}
		for _, why := range res.refused {
			r.event(cd, "Warning", "Orphaned", "left the objects of stage %s", why)
		}
	}
	patch := client.MergeFrom(cd.DeepCopy())
	controllerutil.RemoveFinalizer(cd, Finalizer)
	if err := r.client.Patch(ctx, cd, patch); client.IgnoreNotFound(err) != nil {
		return reconcile.Result{}, fmt.Errorf("remove finalizer from ClusterDeployment %s/%s: %w", cd.Namespace, cd.Name, err)
	}
	r.forget(cd.Namespace, cd.Name)
	return reconcile.Result{}, nil
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}
