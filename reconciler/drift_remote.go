package reconciler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/capstan-dev/capstan/stages"
)

// kubeconfigWatch follows one kubeconfig Secret in the cluster Capstan
// runs in (a watch of that one Secret): its content says which cluster
// the objects applied through it are watched on.
type kubeconfigWatch struct {
	cancel context.CancelFunc
	// known is set once the Secret's content was seen.
	known bool
	// cluster is the hash of the kubeconfig the Secret holds now, the key
	// of its cluster's watch in remotes; "" while it holds none usable.
	cluster string
}

// followKubeconfig starts following the Secret of ref. Its content
// arrives in the background (kubeconfigChanged). Called with w.mu held.
func (w *driftWatcher) followKubeconfig(ref clusterKey) *kubeconfigWatch {
	ctx, cancel := context.WithCancel(w.ctx)
	kw := &kubeconfigWatch{cancel: cancel}
	lw := cache.NewListWatchFromClient(w.secrets, "secrets", ref.namespace, fields.OneTermEqualSelector("metadata.name", ref.secret))
	inf := cache.NewSharedIndexInformer(lw, &corev1.Secret{}, 0, cache.Indexers{})
	logger := log.FromContext(ctx).WithValues("secret", ref.namespace+"/"+ref.secret)
	// Keep the one key read, not every credential the Secret holds.
	err := errors.Join(inf.SetTransform(func(obj any) (any, error) {
		if s, ok := obj.(*corev1.Secret); ok {
			s.Data = map[string][]byte{ref.key: s.Data[ref.key]}
			s.StringData, s.ManagedFields = nil, nil
		}
		return obj, nil
	}), inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		if !normalWatchEnd(err) {
			logger.Info("cannot watch the kubeconfig Secret of a drift watch; retrying", "error", err.Error())
		}
	}))
	if _, herr := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.kubeconfigChanged(ref, kw, obj) },
		UpdateFunc: func(_, obj any) { w.kubeconfigChanged(ref, kw, obj) },
		DeleteFunc: func(any) { w.kubeconfigChanged(ref, kw, nil) },
	}); herr != nil {
		err = errors.Join(err, herr)
	}
	if err != nil {
		logger.Info("cannot watch the kubeconfig Secret of a drift watch", "error", err.Error())
		return kw
	}
	go inf.RunWithContext(ctx)
	return kw
}

// kubeconfigChanged moves the objects applied through ref to the cluster
// its Secret's new content reaches: deployments that hold the same
// kubeconfig share one cluster watch; a cluster watch no kubeconfig
// reaches any more stops. A Secret gone, or one without a usable
// kubeconfig, stops the watches of ref until it is fixed; the deployments'
// state stays as it is and the log says why (never quoting the Secret).
func (w *driftWatcher) kubeconfigChanged(ref clusterKey, kw *kubeconfigWatch, obj any) {
	logger := log.FromContext(w.ctx).WithValues("secret", ref.namespace+"/"+ref.secret, "key", ref.key)
	secret, _ := obj.(*corev1.Secret)
	var data []byte
	if secret != nil {
		data = secret.Data[ref.key]
	}
	id := ""
	if len(data) > 0 {
		sum := sha256.Sum256(data)
		id = hex.EncodeToString(sum[:])
	}
	w.mu.Lock()
	if w.kubeconfigs[ref] != kw || (kw.known && kw.cluster == id) {
		w.mu.Unlock()
		return // no longer followed, or the same kubeconfig
	}
	kw.known = true
	var conn watchConn
	var err error
	if id == "" {
		err = errors.New("the Secret does not exist or its key is empty")
	} else if w.remotes[id] == nil {
		conn, err = w.connect(ref, data)
	}
	if err != nil {
		id = ""
	}
	kw.cluster = id
	if id != "" && w.remotes[id] == nil {
		w.remotes[id] = newClusterWatch(w.ctx, conn, w)
	}
	cw := w.remotes[id]
	users := map[types.NamespacedName]map[string]string{}
	for key, refs := range w.watched {
		if ids, ok := refs[ref]; ok {
			users[key] = maps.Clone(ids)
		}
	}
	w.mu.Unlock()
	if err != nil {
		logger.Info("cannot watch for drift the objects applied through this kubeconfig; waiting for the Secret to change", "error", err.Error())
	} else {
		logger.Info("watching for drift the objects applied through this kubeconfig", "cluster", cw.conn.name, "deployments", len(users))
	}
	if cw != nil {
		for key, ids := range users {
			w.watchKinds(cw, key, ref, ids)
		}
	}
	w.collect()
}

// connect builds the watch connection of the kubeconfig data read from
// ref. Nothing is requested from the cluster; errors name the Secret and
// key, never the content.
func (w *driftWatcher) connect(ref clusterKey, data []byte) (watchConn, error) {
	name := "Secret " + ref.namespace + "/" + ref.secret
	var policy stages.KubeconfigPolicy
	if w.rules != nil {
		policy = w.rules.policy
	}
	cluster, err := stages.NewKubeconfigCluster(name, data, w.scheme, stages.WithKubeconfigPolicy(policy))
	if err != nil {
		return watchConn{}, fmt.Errorf("key %s: %w", ref.key, err)
	}
	return watchConnTo(cluster)
}

// collect stops what no deployment needs any more: the watches of
// kubeconfig Secrets no watched object was applied through, then the
// cluster watches no followed Secret reaches.
func (w *driftWatcher) collect() {
	w.mu.Lock()
	used := map[clusterKey]bool{}
	for _, refs := range w.watched {
		for ref := range refs {
			used[ref] = true
		}
	}
	var stops []func()
	for ref, kw := range w.kubeconfigs {
		if !used[ref] {
			stops = append(stops, kw.cancel)
			delete(w.kubeconfigs, ref)
		}
	}
	reached := map[string]bool{}
	for _, kw := range w.kubeconfigs {
		reached[kw.cluster] = true
	}
	for id, cw := range w.remotes {
		if !reached[id] {
			stops = append(stops, cw.stop)
			delete(w.remotes, id)
		}
	}
	w.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
}
