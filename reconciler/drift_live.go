package reconciler

import (
	"github.com/fluxcd/cli-utils/pkg/object"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// lastDesired returns the desired set kept for a deployment, at whatever
// revision and generation it was kept; nil when there is none.
func (w *driftWatcher) lastDesired(key types.NamespacedName) *desiredSet {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.desired[key]
}

// undrifted returns the metadata the drift watcher holds of one object
// that deployment key applied in the cluster Capstan runs in, when it
// watches that object, holds it (its kind's informer synced) and noted no
// drift of it that was not corrected; nil otherwise. The metadata may lag
// behind the cluster: whoever trusts it must check that the live object
// still has its UID and resourceVersion.
func (w *driftWatcher) undrifted(key types.NamespacedName, id string) *metav1.PartialObjectMetadata {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	_, watched := w.watched[key][localRef][id]
	_, drifted := w.drifted[key][driftKey{ref: localRef, id: id}]
	home := w.home
	w.mu.Unlock()
	if !watched || drifted || home == nil {
		return nil
	}
	m, err := object.ParseObjMetadata(id)
	if err != nil {
		return nil
	}
	home.mu.Lock()
	kw := home.kinds[m.GroupKind]
	home.mu.Unlock()
	if kw == nil {
		return nil
	}
	store, ok := kw.storeOf()
	if !ok {
		return nil
	}
	storeKey := m.Name
	if m.Namespace != "" {
		storeKey = m.Namespace + "/" + m.Name
	}
	item, exists, err := store.GetByKey(storeKey)
	if err != nil || !exists {
		return nil
	}
	meta, _ := item.(*metav1.PartialObjectMetadata)
	return meta
}
