package stages

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fluxcd/cli-utils/pkg/object"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// PruneKey, set to "disabled" as a label or an annotation of an object,
// keeps the object when its source drops it or its deployment is deleted.
const PruneKey = "capstan.dev/prune"

// AdoptAnnotation, set to "true" on an object in the source, lets a
// deployment take over an object of that name that exists in the cluster
// and that no deployment applied.
const AdoptAnnotation = "capstan.dev/adopt"

// Owner labels: which ClusterDeployment applied an object.
const (
	OwnerNameLabel      = OwnerGroup + "/name"
	OwnerNamespaceLabel = OwnerGroup + "/namespace"
)

// DestructiveKinds are the kinds whose deletion destroys machines, hosts
// or everything inside them. They are pruned, or deleted with their
// deployment, only when the deployment sets spec.prune.destructive.
var DestructiveKinds = []schema.GroupKind{
	{Group: "", Kind: "Namespace"},
	{Group: "", Kind: "PersistentVolume"},
	{Group: "", Kind: "PersistentVolumeClaim"},
	{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"},
	{Group: "cluster.x-k8s.io", Kind: "Cluster"},
	{Group: "cluster.x-k8s.io", Kind: "Machine"},
	{Group: "cluster.x-k8s.io", Kind: "MachineSet"},
	{Group: "cluster.x-k8s.io", Kind: "MachineDeployment"},
	{Group: "cluster.x-k8s.io", Kind: "MachinePool"},
	{Group: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane"},
	{Group: "infrastructure.cluster.x-k8s.io", Kind: "Metal3Cluster"},
	{Group: "infrastructure.cluster.x-k8s.io", Kind: "Metal3Machine"},
	{Group: "metal3.io", Kind: "BareMetalHost"},
	{Group: "lcm.capstan.dev", Kind: "LCMCluster"},
	{Group: "lcm.capstan.dev", Kind: "LCMMachine"},
}

// IsDestructive reports whether deleting objects of kind gk destroys
// machines or data.
func IsDestructive(gk schema.GroupKind) bool {
	return slices.Contains(DestructiveKinds, gk)
}

// ObjectID is the inventory ID of obj: namespace_name_group_kind.
func ObjectID(obj *unstructured.Unstructured) string {
	return object.UnstructuredToObjMetadata(obj).String()
}

// InventoryOf returns what an apply stage applied through this executor:
// its objects, and the kubeconfig Secret of its cluster when that is not
// the one Capstan runs in.
func (e *Executor) InventoryOf(stage *Stage) capstanv1.InventoryStage {
	inv := capstanv1.InventoryStage{Name: stage.Name, Entries: make([]capstanv1.InventoryEntry, 0, len(stage.Objects))}
	if e.kubeConfig != nil {
		ref := *e.kubeConfig
		inv.KubeConfig, inv.KubeConfigNamespace = &ref, e.kubeConfigNamespace
	}
	for _, obj := range stage.Objects {
		inv.Entries = append(inv.Entries, capstanv1.InventoryEntry{ID: ObjectID(obj), Version: obj.GroupVersionKind().Version})
	}
	sortEntries(inv.Entries)
	return inv
}

func sortEntries(entries []capstanv1.InventoryEntry) {
	slices.SortFunc(entries, func(a, b capstanv1.InventoryEntry) int { return strings.Compare(a.ID, b.ID) })
}

// MergeInventory records that stage applied its objects: they join the
// entries the stage already had, which stay until a prune removes them.
// A stage new to the inventory goes before the first stage that follows it
// in order (the plan's stage names), so that the inventory keeps plan order
// and stages the plan dropped keep their place for a reverse-order prune.
func MergeInventory(inv *capstanv1.Inventory, stage capstanv1.InventoryStage, order []string) {
	for i := range inv.Stages {
		if inv.Stages[i].Name != stage.Name {
			continue
		}
		seen := map[string]bool{}
		for _, e := range stage.Entries {
			seen[e.ID] = true
		}
		for _, e := range inv.Stages[i].Entries {
			if !seen[e.ID] {
				stage.Entries = append(stage.Entries, e)
			}
		}
		sortEntries(stage.Entries)
		inv.Stages[i] = stage
		return
	}
	pos := slices.Index(order, stage.Name)
	at := slices.IndexFunc(inv.Stages, func(s capstanv1.InventoryStage) bool { return slices.Index(order, s.Name) > pos })
	if at < 0 {
		at = len(inv.Stages)
	}
	inv.Stages = slices.Insert(inv.Stages, at, stage)
}

// Stale returns the entries of inv whose objects no stage of plan applies
// any more, grouped by inventory stage, in inventory (plan) order.
func Stale(inv *capstanv1.Inventory, plan *Plan) []capstanv1.InventoryStage {
	if inv == nil {
		return nil
	}
	current := map[string]bool{}
	for _, obj := range plan.AppliedObjects() {
		current[ObjectID(obj)] = true
	}
	var stale []capstanv1.InventoryStage
	for _, s := range inv.Stages {
		g := s
		g.Entries = nil
		for _, e := range s.Entries {
			if !current[e.ID] {
				g.Entries = append(g.Entries, e)
			}
		}
		if len(g.Entries) > 0 {
			stale = append(stale, g)
		}
	}
	return stale
}

// RemoveFromInventory drops the entries with the given IDs, and stages
// left without entries.
func RemoveFromInventory(inv *capstanv1.Inventory, ids map[string]bool) {
	kept := inv.Stages[:0]
	for _, s := range inv.Stages {
		s.Entries = slices.DeleteFunc(s.Entries, func(e capstanv1.InventoryEntry) bool { return ids[e.ID] })
		if len(s.Entries) > 0 {
			kept = append(kept, s)
		}
	}
	inv.Stages = kept
}

// InventoryIDs returns the IDs of every entry of inv.
func InventoryIDs(inv *capstanv1.Inventory) map[string]bool {
	ids := map[string]bool{}
	if inv != nil {
		for _, s := range inv.Stages {
			for _, e := range s.Entries {
				ids[e.ID] = true
			}
		}
	}
	return ids
}

// PruneResult is what one prune pass over a stage's entries found and did.
type PruneResult struct {
	// Gone are the entries whose objects no longer exist (deleted by this
	// pass and already gone, or gone before) or are no longer this
	// deployment's: they leave the inventory.
	Gone []string
	// Kept are the objects marked capstan.dev/prune: disabled; they stay
	// in the cluster and leave the inventory.
	Kept []string
	// Protected are objects never deleted (protect.go), by ID, with why;
	// they stay in the cluster and leave the inventory.
	Protected map[string]string
	// Held are objects of destructive kinds, kept because the deployment
	// does not allow pruning them; they stay in the inventory.
	Held []string
	// Deleting are objects whose deletion was requested and that still
	// exist (finalizers at work).
	Deleting []string
}

// Done reports whether nothing of the pass is still being deleted.
func (r PruneResult) Done() bool { return len(r.Deleting) == 0 }

// PruneOptions tune a prune pass.
type PruneOptions struct {
	// Destructive allows deleting objects of destructive kinds.
	Destructive bool
	// DryRun only looks: what would be deleted is returned in Deleting.
	DryRun bool
}

// Prune deletes the objects of entries that belong to owner, except those
// marked capstan.dev/prune: disabled, those never deleted (protect.go)
// and, unless opts.Destructive, those of destructive kinds. With opts.DryRun it deletes nothing and
// returns what it would delete in Deleting. It does not wait: objects still being
// deleted are returned in Deleting, and the next pass finds them gone.
func (e *Executor) Prune(ctx context.Context, entries []capstanv1.InventoryEntry, owner Owner, opts PruneOptions) (PruneResult, error) {
	var res PruneResult
	if len(entries) == 0 {
		return res, nil
	}
	if !opts.DryRun {
		if err := e.checkFence(ctx, owner); err != nil {
			return res, fmt.Errorf("prune: %w", err)
		}
	}
	var errs []error
	for _, entry := range entries {
		id, err := object.ParseObjMetadata(entry.ID)
		if err != nil {
			// Not an ID this version writes: nothing to delete by it.
			res.Gone = append(res.Gone, entry.ID)
			continue
		}
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(id.GroupKind.WithVersion(entry.Version))
		err = e.client.Get(ctx, client.ObjectKey{Namespace: id.Namespace, Name: id.Name}, live)
		switch {
		case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
			res.Gone = append(res.Gone, entry.ID)
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("prune %s: %w", entryRef(id), err))
			continue
		}
		labels := live.GetLabels()
		switch {
		case labels[OwnerNameLabel] != owner.Name || labels[OwnerNamespaceLabel] != owner.Namespace:
			// Another deployment took it over: not this one's to delete.
			res.Gone = append(res.Gone, entry.ID)
			continue
		case labels[PruneKey] == "disabled" || live.GetAnnotations()[PruneKey] == "disabled":
			res.Kept = append(res.Kept, entry.ID)
			continue
		}
		why, err := e.protects(ctx, live)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("prune %s: %w", entryRef(id), err))
			continue
		case why != "":
			if res.Protected == nil {
				res.Protected = map[string]string{}
			}
			res.Protected[entry.ID] = why
			continue
		case IsDestructive(id.GroupKind) && !opts.Destructive:
			res.Held = append(res.Held, entry.ID)
			continue
		case live.GetDeletionTimestamp() != nil, opts.DryRun:
			res.Deleting = append(res.Deleting, entry.ID)
			continue
		}
		err = e.client.Delete(ctx, live, client.PropagationPolicy("Background"), client.Preconditions{UID: ptrTo(live.GetUID())})
		switch {
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			res.Gone = append(res.Gone, entry.ID)
		case err != nil:
			errs = append(errs, fmt.Errorf("prune %s: %w", entryRef(id), err))
		default:
			res.Deleting = append(res.Deleting, entry.ID)
		}
	}
	return res, errors.Join(errs...)
}

func ptrTo[T any](v T) *T { return &v }

// entryRef names an inventory object the way ObjectRef names an object.
func entryRef(id object.ObjMetadata) string {
	if id.Namespace == "" {
		return id.GroupKind.Kind + "/" + id.Name
	}
	return id.GroupKind.Kind + "/" + id.Namespace + "/" + id.Name
}

// EntryRef names the object of an inventory ID for messages: Kind/ns/name.
func EntryRef(id string) string {
	m, err := object.ParseObjMetadata(id)
	if err != nil {
		return id
	}
	return entryRef(m)
}

// AnyDestructive reports whether some entry is of a destructive kind.
func AnyDestructive(entries []capstanv1.InventoryEntry) bool {
	return slices.ContainsFunc(entries, func(e capstanv1.InventoryEntry) bool {
		m, err := object.ParseObjMetadata(e.ID)
		return err == nil && IsDestructive(m.GroupKind)
	})
}
