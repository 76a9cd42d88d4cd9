package reconciler

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/fluxcd/cli-utils/pkg/object"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/stages"
)

// driftWatcher watches the objects deployments applied to the cluster
// Capstan runs in: one metadata informer per kind, shared by every
// deployment, limited to objects with Capstan's owner label. An object
// deleted, or one whose fields applied by Capstan another field manager
// took over (kubectl edit, a foreign apply), is drift: it is noted for
// its deployment, which is woken up to correct it (correctDrift).
//
// Watching costs one watch per kind, not requests per interval: a Ready
// deployment whose source did not change still makes no API request.
type driftWatcher struct {
	client metadata.Interface
	mapper meta.RESTMapper
	wake   chan<- event.GenericEvent

	mu        sync.Mutex
	ctx       context.Context // set by Start: informers live as long as it
	informers map[schema.GroupVersionResource]cache.SharedIndexInformer
	// watched holds, per deployment, the IDs of its objects watched for
	// drift; drifted what happened to those that drifted.
	watched map[types.NamespacedName]map[string]bool
	drifted map[types.NamespacedName]map[string]string
	// desired holds, per deployment, what its plan applies here.
	desired map[types.NamespacedName]*desiredSet
	// pending holds deployments tracked before Start.
	pending []*capstanv1.ClusterDeployment
}

func newDriftWatcher(client metadata.Interface, mapper meta.RESTMapper, wake chan<- event.GenericEvent) *driftWatcher {
	return &driftWatcher{
		client: client, mapper: mapper, wake: wake,
		informers: map[schema.GroupVersionResource]cache.SharedIndexInformer{},
		watched:   map[types.NamespacedName]map[string]bool{},
		drifted:   map[types.NamespacedName]map[string]string{},
	}
}

// Start runs the informers until ctx ends (manager.Runnable; it runs on
// the leader only, like the controller).
func (w *driftWatcher) Start(ctx context.Context) error {
	w.mu.Lock()
	w.ctx = ctx
	pending := w.pending
	w.pending = nil
	w.mu.Unlock()
	for _, cd := range pending {
		w.track(cd)
	}
	<-ctx.Done()
	return nil
}

// track watches the objects in cd's inventory that were applied to the
// cluster Capstan runs in, and stops watching those no longer in it. An
// object of the inventory already missing when its kind's informer has
// synced counts as deleted: it went while no one watched.
func (w *driftWatcher) track(cd *capstanv1.ClusterDeployment) {
	if w == nil {
		return
	}
	key := types.NamespacedName{Namespace: cd.Namespace, Name: cd.Name}
	ids := map[string]bool{}
	if cd.Spec.Drift != capstanv1.DriftIgnore && cd.Status.Inventory != nil {
		for _, s := range cd.Status.Inventory.Stages {
			if s.KubeConfig != nil {
				continue // another cluster: corrected when its stages run
			}
			for _, e := range s.Entries {
				ids[e.ID] = true
			}
		}
	}
	w.mu.Lock()
	if w.ctx == nil {
		w.pending = append(slices.DeleteFunc(w.pending, func(p *capstanv1.ClusterDeployment) bool {
			return p.Namespace == cd.Namespace && p.Name == cd.Name
		}), cd.DeepCopy())
		w.mu.Unlock()
		return
	}
	old := w.watched[key]
	if len(ids) == 0 {
		delete(w.watched, key)
		delete(w.drifted, key)
	} else {
		w.watched[key] = ids
	}
	w.mu.Unlock()
	if maps.Equal(old, ids) {
		return
	}
	versions := map[schema.GroupKind]string{}
	if cd.Status.Inventory != nil {
		for _, s := range cd.Status.Inventory.Stages {
			for _, e := range s.Entries {
				if m, err := object.ParseObjMetadata(e.ID); err == nil && ids[e.ID] {
					versions[m.GroupKind] = e.Version
				}
			}
		}
	}
	for gk, version := range versions {
		inf, err := w.informer(gk, version)
		if err != nil {
			log.FromContext(w.ctx).Info("cannot watch applied objects for drift", "kind", gk.String(), "error", err.Error())
			continue
		}
		go w.findMissing(key, gk, inf)
	}
}

// forget stops watching a deployment's objects.
func (w *driftWatcher) forget(key types.NamespacedName) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.watched, key)
	delete(w.drifted, key)
	delete(w.desired, key)
}

// take returns and clears what drifted of a deployment's objects: ID to
// what happened to it.
func (w *driftWatcher) take(key types.NamespacedName) map[string]string {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.drifted[key]
	delete(w.drifted, key)
	return d
}

// has reports whether some of a deployment's objects drifted.
func (w *driftWatcher) has(key types.NamespacedName) bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.drifted[key]) > 0
}

// informer returns the informer of kind gk, started on first use.
func (w *driftWatcher) informer(gk schema.GroupKind, version string) (cache.SharedIndexInformer, error) {
	mapping, err := w.mapper.RESTMapping(gk, version)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if inf, ok := w.informers[mapping.Resource]; ok {
		return inf, nil
	}
	inf := metadatainformer.NewFilteredMetadataInformer(w.client, mapping.Resource, metav1.NamespaceAll, 0, cache.Indexers{},
		func(o *metav1.ListOptions) { o.LabelSelector = stages.OwnerNameLabel }).Informer()
	_, err = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			if who := tookOver(oldObj, newObj); who != "" {
				w.note(gk, newObj, "changed by "+who)
			}
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			w.note(gk, obj, "deleted")
		},
	})
	if err != nil {
		return nil, err
	}
	w.informers[mapping.Resource] = inf
	go inf.Run(w.ctx.Done())
	return inf, nil
}

// findMissing notes the watched objects of kind gk of a deployment that
// the informer, once synced, does not hold.
func (w *driftWatcher) findMissing(key types.NamespacedName, gk schema.GroupKind, inf cache.SharedIndexInformer) {
	if !cache.WaitForCacheSync(w.ctx.Done(), inf.HasSynced) {
		return
	}
	w.mu.Lock()
	var missing []string
	for id := range w.watched[key] {
		m, err := object.ParseObjMetadata(id)
		if err != nil || m.GroupKind != gk {
			continue
		}
		storeKey := m.Name
		if m.Namespace != "" {
			storeKey = m.Namespace + "/" + m.Name
		}
		if _, exists, _ := inf.GetStore().GetByKey(storeKey); !exists {
			missing = append(missing, id)
		}
	}
	w.mu.Unlock()
	for _, id := range missing {
		w.mark(key, id, "deleted")
	}
}

// note records an event on a watched object as drift of its deployment.
func (w *driftWatcher) note(gk schema.GroupKind, obj any, what string) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	key := types.NamespacedName{Namespace: m.Labels[stages.OwnerNamespaceLabel], Name: m.Labels[stages.OwnerNameLabel]}
	id := object.ObjMetadata{Namespace: m.Namespace, Name: m.Name, GroupKind: gk}.String()
	w.mark(key, id, what)
}

func (w *driftWatcher) mark(key types.NamespacedName, id, what string) {
	w.mu.Lock()
	if !w.watched[key][id] {
		w.mu.Unlock()
		return
	}
	if w.drifted[key] == nil {
		w.drifted[key] = map[string]string{}
	}
	w.drifted[key][id] = what
	w.mu.Unlock()
	cd := &capstanv1.ClusterDeployment{}
	cd.Namespace, cd.Name = key.Namespace, key.Name
	select {
	case w.wake <- event.GenericEvent{Object: cd}:
	default:
		// The controller is busy: wake it without holding up the informer.
		go func() { w.wake <- event.GenericEvent{Object: cd} }()
	}
}

// tookOver returns the field manager that took fields Capstan applied
// away from it between oldObj and newObj, or "". Fields change hands when
// another manager updates them (kubectl edit, a patch) or applies them
// with force: Capstan's managed-fields entry changes while its time stays,
// since Capstan did not write. (Capstan's own apply updates the time; two
// applies within one second look like drift and cost one more apply.)
// Capstan's other managers (capstan-scale, capstan-rollout) taking fields
// is the plan at work, not drift.
func tookOver(oldObj, newObj any) string {
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
	// Who wrote last, of the managers that are not Capstan's.
	var who string
	var when *metav1.Time
	for _, mf := range n.ManagedFields {
		if mf.Subresource != "" || strings.HasPrefix(mf.Manager, stages.FieldManager) {
			continue
		}
		if who == "" || (mf.Time != nil && (when == nil || when.Before(mf.Time))) {
			who, when = mf.Manager, mf.Time
		}
	}
	return who
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

func appliedEntry(obj *metav1.PartialObjectMetadata) *metav1.ManagedFieldsEntry {
	for i, mf := range obj.ManagedFields {
		if mf.Manager == stages.FieldManager && mf.Operation == metav1.ManagedFieldsOperationApply && mf.Subresource == "" {
			return &obj.ManagedFields[i]
		}
	}
	return nil
}

// desiredSet is what a deployment's plan applies to the cluster Capstan
// runs in, at one revision and generation, kept compactly (JSON) so that
// drift is corrected without fetching and rendering again.
type desiredSet struct {
	revision   string
	generation int64
	objects    map[string]desiredObject
}

type desiredObject struct {
	stage string
	json  []byte
}

// desiredOf builds the desired set of a plan. Objects a delete stage
// removes are left out (they must stay gone), and so are objects of
// stages acting on other clusters; an object a scale stage sets the
// replicas of is kept without spec.replicas, which the scale stage owns.
func desiredOf(cd *capstanv1.ClusterDeployment, revision string, plan *stages.Plan) (*desiredSet, error) {
	set := &desiredSet{revision: revision, generation: cd.Generation, objects: map[string]desiredObject{}}
	deleted, scaled := map[string]bool{}, map[string]bool{}
	for i := range plan.Stages {
		for _, obj := range plan.Stages[i].Objects {
			switch plan.Stages[i].Action {
			case capstanv1.StageActionDelete:
				deleted[stages.ObjectID(obj)] = true
			case capstanv1.StageActionScale:
				scaled[stages.ObjectID(obj)] = true
			}
		}
	}
	for i := range plan.Stages {
		stage := &plan.Stages[i]
		if (stage.Action != capstanv1.StageActionApply && stage.Action != "") || stage.KubeConfig != nil || cd.Spec.KubeConfig != nil {
			continue
		}
		for _, obj := range stage.Objects {
			id := stages.ObjectID(obj)
			if deleted[id] {
				continue
			}
			if scaled[id] {
				obj = obj.DeepCopy()
				unstructured.RemoveNestedField(obj.Object, "spec", "replicas")
			}
			data, err := obj.MarshalJSON()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", stages.ObjectRef(obj), err)
			}
			set.objects[id] = desiredObject{stage: stage.Name, json: data}
		}
	}
	return set, nil
}

// remember keeps the desired set of a deployment for later corrections.
func (w *driftWatcher) remember(key types.NamespacedName, set *desiredSet) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.desired == nil {
		w.desired = map[types.NamespacedName]*desiredSet{}
	}
	w.desired[key] = set
}

// desiredFor returns the desired set kept for a deployment at this
// revision and generation, or nil.
func (w *driftWatcher) desiredFor(key types.NamespacedName, revision string, generation int64) *desiredSet {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if set := w.desired[key]; set != nil && set.revision == revision && set.generation == generation {
		return set
	}
	return nil
}

// correctDrift applies again, one by one, the objects of the desired set
// that drifted (spec.drift: correct), or only reports them (report).
// Objects not in the set (about to be pruned, removed by a delete stage,
// on another cluster) are left alone.
func (r *Reconciler) correctDrift(ctx context.Context, cd *capstanv1.ClusterDeployment, set *desiredSet, drifted map[string]string) error {
	if len(drifted) == 0 || set == nil || cd.Spec.Drift == capstanv1.DriftIgnore {
		return nil
	}
	owner := stages.Owner{Name: cd.Name, Namespace: cd.Namespace}
	var errs []string
	for _, id := range slices.Sorted(maps.Keys(drifted)) {
		d, ok := set.objects[id]
		if !ok {
			continue
		}
		what := drifted[id]
		if cd.Spec.Drift == capstanv1.DriftReport {
			r.metrics.CountDrift(cd, metrics.DriftReported)
			r.event(cd, "Warning", "DriftDetected", "%s was %s; spec.drift is report, so it stays as it is", stages.EntryRef(id), what)
			continue
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(d.json); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", stages.EntryRef(id), err))
			continue
		}
		if err := r.executor.Reapply(ctx, obj, d.stage, owner); err != nil {
			errs = append(errs, err.Error())
			continue
		}
		r.metrics.CountDrift(cd, metrics.DriftCorrected)
		r.event(cd, "Normal", "DriftCorrected", "%s was %s; applied it again", stages.EntryRef(id), what)
	}
	if len(errs) > 0 {
		return fmt.Errorf("correct drift: %s", strings.Join(errs, "; "))
	}
	return nil
}

// correctFromPlan keeps the desired set of the attempt's plan and corrects
// what drifted of the deployment.
func (r *Reconciler) correctFromPlan(ctx context.Context, a *attempt) error {
	key := types.NamespacedName{Namespace: a.cd.Namespace, Name: a.cd.Name}
	set, err := desiredOf(a.cd, a.revision, a.plan)
	if err != nil {
		return err
	}
	r.drift.remember(key, set)
	return r.correctDrift(ctx, a.cd, set, r.drift.take(key))
}
