package reconciler

import (
	"context"
	"maps"
	"slices"
	"sync"

	"github.com/fluxcd/cli-utils/pkg/object"
	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// driftWatcher watches the objects deployments applied, in the cluster
// Capstan runs in and in the clusters their stages reach through
// kubeconfig Secrets: per cluster, one metadata informer per kind, shared
// by every deployment that applied objects of that kind there, limited to
// objects with Capstan's owner label (clusterWatch). An object deleted,
// one whose fields applied by Capstan another field manager took over
// (kubectl edit, a foreign apply), or one stripped of such a field (a key
// deleted by hand; fieldsDrift) is drift: it is noted for its deployment,
// which is woken up to correct it (correctDrift).
//
// A remote cluster is the content of a kubeconfig: deployments whose
// Secrets hold the same kubeconfig share its watches, which stop when no
// deployment needs them any more or when the Secret changes
// (drift_remote.go).
//
// Watching costs one watch per kind and cluster (and one per kubeconfig
// Secret), not requests per interval: a Ready deployment whose source did
// not change still makes no API request to any cluster.
type driftWatcher struct {
	logger  logr.Logger
	local   watchConn
	secrets rest.Interface // reads kubeconfig Secrets in the cluster Capstan runs in
	scheme  *runtime.Scheme
	wake    chan<- event.GenericEvent
	// rules say which kubeconfig Secrets a deployment's objects are
	// watched through, and what a kubeconfig may hold; nil: the defaults.
	rules *kubeconfigRules

	mu  sync.Mutex
	ctx context.Context // set by Start: watches live as long as it
	// home watches the cluster Capstan runs in; remotes the others, by
	// the hash of the kubeconfig that reaches them; kubeconfigs follow
	// the Secrets those kubeconfigs are read from.
	home        *clusterWatch
	remotes     map[string]*clusterWatch
	kubeconfigs map[clusterKey]*kubeconfigWatch
	// watched holds, per deployment and kubeconfig (localRef for the
	// cluster Capstan runs in), the IDs of its objects watched for drift
	// and the versions they were applied with; drifted what happened to
	// those that drifted.
	watched map[types.NamespacedName]map[clusterKey]map[string]string
	drifted map[types.NamespacedName]map[driftKey]string
	// desired holds, per deployment, what its plan applies.
	desired map[types.NamespacedName]*desiredSet
	// pending holds deployments tracked before Start.
	pending []*capstanv1.ClusterDeployment
}

// localRef is the clusterKey of the cluster Capstan runs in.
var localRef = clusterKey{}

// driftKey names one applied object: the kubeconfig it was applied
// through (localRef for the cluster Capstan runs in) and its ID.
type driftKey struct {
	ref clusterKey
	id  string
}

// where says in which cluster the object is, for events: "" for the
// cluster Capstan runs in.
func (k driftKey) where() string {
	if k.ref == localRef {
		return ""
	}
	return " in the cluster of Secret " + k.ref.namespace + "/" + k.ref.secret
}

// newDriftWatcher returns a watcher of the cluster of local and of those
// reached through kubeconfig Secrets read with secrets; it logs to logger
// (the manager starts runnables with a context of its own, without the
// daemon's logger).
func newDriftWatcher(logger logr.Logger, local watchConn, secrets rest.Interface, scheme *runtime.Scheme, wake chan<- event.GenericEvent) *driftWatcher {
	return &driftWatcher{
		logger: logger, local: local, secrets: secrets, scheme: scheme, wake: wake,
		remotes:     map[string]*clusterWatch{},
		kubeconfigs: map[clusterKey]*kubeconfigWatch{},
		watched:     map[types.NamespacedName]map[clusterKey]map[string]string{},
		drifted:     map[types.NamespacedName]map[driftKey]string{},
	}
}

var _ driftSink = (*driftWatcher)(nil)

// Start runs the watches until ctx ends (manager.Runnable; it runs on
// the leader only, like the controller).
func (w *driftWatcher) Start(ctx context.Context) error {
	ctx = log.IntoContext(ctx, w.logger)
	w.mu.Lock()
	w.ctx = ctx
	w.home = newClusterWatch(ctx, w.local, w)
	pending := w.pending
	w.pending = nil
	w.mu.Unlock()
	for _, cd := range pending {
		w.track(cd)
	}
	<-ctx.Done()
	return nil
}

// watchedOf returns the objects of cd's inventory to watch, by the
// kubeconfig they were applied through: none when spec.drift is ignore.
func watchedOf(cd *capstanv1.ClusterDeployment, rules *kubeconfigRules) map[clusterKey]map[string]string {
	refs := map[clusterKey]map[string]string{}
	if cd.Spec.Drift == capstanv1.DriftIgnore || cd.Status.Inventory == nil {
		return refs
	}
	for _, s := range cd.Status.Inventory.Stages {
		ref, err := inventoryKey(cd, s, rules)
		if err != nil {
			// Refused (another namespace's Secret): not watched; the
			// walk and the prune say why.
			continue
		}
		for _, e := range s.Entries {
			if refs[ref] == nil {
				refs[ref] = map[string]string{}
			}
			refs[ref][e.ID] = e.Version
		}
	}
	return refs
}

// track watches the objects in cd's inventory, in the clusters they were
// applied to, and stops watching those no longer in it. An object of the
// inventory already missing when its kind's informer has synced counts as
// deleted: it went while no one watched. Nothing here waits for a
// cluster: an unchanged inventory costs nothing, and a new one starts
// watches in the background.
func (w *driftWatcher) track(cd *capstanv1.ClusterDeployment) {
	if w == nil {
		return
	}
	key := types.NamespacedName{Namespace: cd.Namespace, Name: cd.Name}
	refs := watchedOf(cd, w.rules)
	w.mu.Lock()
	if w.ctx == nil {
		w.pending = append(slices.DeleteFunc(w.pending, func(p *capstanv1.ClusterDeployment) bool {
			return p.Namespace == cd.Namespace && p.Name == cd.Name
		}), cd.DeepCopy())
		w.mu.Unlock()
		return
	}
	old := w.watched[key]
	if maps.EqualFunc(old, refs, maps.Equal) {
		w.mu.Unlock()
		return
	}
	if len(refs) == 0 {
		delete(w.watched, key)
		delete(w.drifted, key)
	} else {
		w.watched[key] = refs
	}
	type start struct {
		cw  *clusterWatch
		ref clusterKey
	}
	var starts []start
	for ref, ids := range refs {
		if maps.Equal(old[ref], ids) {
			continue
		}
		if ref != localRef && w.kubeconfigs[ref] == nil {
			// The Secret's first content connects, and watches the kinds
			// of every deployment that names it (kubeconfigChanged).
			w.kubeconfigs[ref] = w.followKubeconfig(ref)
			continue
		}
		if cw := w.clusterOfLocked(ref); cw != nil {
			starts = append(starts, start{cw: cw, ref: ref})
		}
	}
	w.mu.Unlock()
	for _, s := range starts {
		w.watchKinds(s.cw, key, s.ref, refs[s.ref])
	}
	w.collect()
}

// forget stops watching a deployment's objects.
func (w *driftWatcher) forget(key types.NamespacedName) {
	if w == nil {
		return
	}
	w.mu.Lock()
	delete(w.watched, key)
	delete(w.drifted, key)
	delete(w.desired, key)
	w.mu.Unlock()
	w.collect()
}

// take returns and clears what drifted of a deployment's objects: what
// happened to each.
func (w *driftWatcher) take(key types.NamespacedName) map[driftKey]string {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.drifted[key]
	delete(w.drifted, key)
	return d
}

// restore notes again drift that take returned but that could not be
// corrected, unless the object drifted again meanwhile or is no longer
// watched: the next attempt corrects it.
func (w *driftWatcher) restore(key types.NamespacedName, left map[driftKey]string) {
	if w == nil || len(left) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for dk, what := range left {
		if _, ok := w.watched[key][dk.ref][dk.id]; !ok {
			continue
		}
		if w.drifted[key] == nil {
			w.drifted[key] = map[driftKey]string{}
		}
		if _, again := w.drifted[key][dk]; !again {
			w.drifted[key][dk] = what
		}
	}
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

// clusterOf returns the watch of the cluster ref reaches now; nil while
// its Secret gives no usable kubeconfig, or before Start.
func (w *driftWatcher) clusterOf(ref clusterKey) *clusterWatch {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.clusterOfLocked(ref)
}

func (w *driftWatcher) clusterOfLocked(ref clusterKey) *clusterWatch {
	if ref == localRef {
		return w.home
	}
	if kw := w.kubeconfigs[ref]; kw != nil && kw.cluster != "" {
		return w.remotes[kw.cluster]
	}
	return nil
}

// watchKinds makes sure cw watches the kinds of ids, the objects deployment
// key applied through ref, and looks for those already missing from the
// kinds cw holds already (the others are looked for once synced).
func (w *driftWatcher) watchKinds(cw *clusterWatch, key types.NamespacedName, ref clusterKey, ids map[string]string) {
	versions := map[schema.GroupKind]string{}
	for id, version := range ids {
		if m, err := object.ParseObjMetadata(id); err == nil {
			versions[m.GroupKind] = version
		}
	}
	for gk, version := range versions {
		kw := cw.watch(gk, version)
		if kw == nil {
			return // stopped: the cluster is no longer watched
		}
		if store, ok := kw.storeOf(); ok {
			w.mark(cw, key, missingFrom(absentFrom(store), gk, ref, w.idsOf(key, ref)), "deleted")
		}
	}
}

func (w *driftWatcher) idsOf(key types.NamespacedName, ref clusterKey) map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.watched[key][ref])
}

// synced looks, once cw holds every object of kind gk, for the objects of
// that kind missing there of every deployment watched on cw.
func (w *driftWatcher) synced(cw *clusterWatch, gk schema.GroupKind, absent func(key string) bool) {
	w.mu.Lock()
	missing := map[types.NamespacedName][]driftKey{}
	for key, refs := range w.watched {
		for ref, ids := range refs {
			if w.clusterOfLocked(ref) == cw {
				missing[key] = append(missing[key], missingFrom(absent, gk, ref, ids)...)
			}
		}
	}
	w.mu.Unlock()
	for key, keys := range missing {
		w.mark(cw, key, keys, "deleted")
	}
}

func absentFrom(store cache.Store) func(key string) bool {
	return func(key string) bool {
		_, exists, _ := store.GetByKey(key)
		return !exists
	}
}

// missingFrom returns the objects of kind gk among ids that are absent.
func missingFrom(absent func(key string) bool, gk schema.GroupKind, ref clusterKey, ids map[string]string) []driftKey {
	var missing []driftKey
	for id := range ids {
		m, err := object.ParseObjMetadata(id)
		if err != nil || m.GroupKind != gk {
			continue
		}
		storeKey := m.Name
		if m.Namespace != "" {
			storeKey = m.Namespace + "/" + m.Name
		}
		if absent(storeKey) {
			missing = append(missing, driftKey{ref: ref, id: id})
		}
	}
	return missing
}

// changed notes an event on a watched object of cw's cluster as drift of
// its deployment.
func (w *driftWatcher) changed(cw *clusterWatch, gk schema.GroupKind, obj any, what string) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	key := types.NamespacedName{Namespace: m.Labels[stages.OwnerNamespaceLabel], Name: m.Labels[stages.OwnerNameLabel]}
	id := object.ObjMetadata{Namespace: m.Namespace, Name: m.Name, GroupKind: gk}.String()
	w.mu.Lock()
	var keys []driftKey
	for ref := range w.watched[key] {
		keys = append(keys, driftKey{ref: ref, id: id})
	}
	w.mu.Unlock()
	w.mark(cw, key, keys, what)
}

// mark notes what happened to the objects keys of a deployment, those
// still watched in cw's cluster, and wakes the deployment up.
func (w *driftWatcher) mark(cw *clusterWatch, key types.NamespacedName, keys []driftKey, what string) {
	w.mu.Lock()
	marked := false
	for _, dk := range keys {
		if _, ok := w.watched[key][dk.ref][dk.id]; !ok || w.clusterOfLocked(dk.ref) != cw {
			continue // not this deployment's, or events of a cluster it left
		}
		if w.drifted[key] == nil {
			w.drifted[key] = map[driftKey]string{}
		}
		w.drifted[key][dk] = what
		marked = true
	}
	w.mu.Unlock()
	if !marked {
		return
	}
	cd := &capstanv1.ClusterDeployment{}
	cd.Namespace, cd.Name = key.Namespace, key.Name
	select {
	case w.wake <- event.GenericEvent{Object: cd}:
	default:
		// The controller is busy: wake it without holding up the informer.
		go func() { w.wake <- event.GenericEvent{Object: cd} }()
	}
}
