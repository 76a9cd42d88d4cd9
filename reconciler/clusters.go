package reconciler

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// unreachableRetryMax caps the backoff while a stage waits for its
// cluster: short enough that a cluster coming back (or a fixed Secret,
// which nothing watches) is noticed within it.
const unreachableRetryMax = 30 * time.Second

// clusterKey names a kubeconfig: its Secret and key.
type clusterKey struct {
	namespace, secret, key string
}

// clusterEntry is a connection built from one version of a Secret, and
// the deployments (namespace/name) that use it.
type clusterEntry struct {
	resourceVersion string
	cluster         stages.Cluster
	users           map[string]bool
}

// clusterCache holds the connections to other clusters, built from
// kubeconfig Secrets. A connection is kept while its Secret keeps its
// resourceVersion, so its REST mapper and HTTP connections are reused
// across attempts; a changed Secret gets a new one, and a deployment that
// is gone drops its share.
type clusterCache struct {
	reader client.Reader
	scheme *runtime.Scheme

	mu      sync.Mutex
	entries map[clusterKey]*clusterEntry
}

func newClusterCache(reader client.Reader, scheme *runtime.Scheme) *clusterCache {
	return &clusterCache{reader: reader, scheme: scheme, entries: map[clusterKey]*clusterEntry{}}
}

// kubeConfigFor returns the kubeconfig a stage acts through: its own,
// else the deployment's; nil for the cluster Capstan runs in. A pivot
// stage without one moves into the cluster the deployment builds: the
// Cluster API Cluster it applies.
func kubeConfigFor(cd *capstanv1.ClusterDeployment, stage *stages.Stage) *capstanv1.KubeConfigReference {
	if stage.KubeConfig != nil {
		return stage.KubeConfig
	}
	if cd.Spec.KubeConfig != nil {
		return cd.Spec.KubeConfig
	}
	if stage.Action == capstanv1.StageActionPivot {
		return &capstanv1.KubeConfigReference{Cluster: &capstanv1.ClusterKubeConfigReference{}}
	}
	return nil
}

// clusterAPIGroup is Cluster API's core group, whose Cluster a
// kubeConfig.cluster names.
const clusterAPIGroup = "cluster.x-k8s.io"

// resolveKubeConfig turns ref into the Secret and key to read: the named
// Secret in cd's namespace, or the one Cluster API writes for a Cluster
// the deployment applies (objects), in that Cluster's namespace. A
// reference that names no such Cluster, or that is ambiguous, is stalled:
// only a change to the source or the deployment can fix it.
func resolveKubeConfig(cd *capstanv1.ClusterDeployment, ref *capstanv1.KubeConfigReference, objects []*unstructured.Unstructured) (clusterKey, error) {
	switch {
	case ref.SecretRef != nil && ref.Cluster != nil:
		return clusterKey{}, stages.Stalled(errors.New("kubeConfig: set secretRef or cluster, not both"))
	case ref.SecretRef != nil:
		key := clusterKey{namespace: cd.Namespace, secret: ref.SecretRef.Name, key: ref.SecretRef.Key}
		if key.key == "" {
			key.key = capstanv1.DefaultKubeConfigKey
		}
		return key, nil
	case ref.Cluster == nil:
		return clusterKey{}, stages.Stalled(errors.New("kubeConfig: set secretRef (a Secret holding a kubeconfig) or cluster (a Cluster API Cluster of the deployment)"))
	}
	var found []*unstructured.Unstructured
	for _, obj := range objects {
		gvk := obj.GroupVersionKind()
		if gvk.Group == clusterAPIGroup && gvk.Kind == "Cluster" && (ref.Cluster.Name == "" || obj.GetName() == ref.Cluster.Name) {
			found = append(found, obj)
		}
	}
	switch {
	case len(found) == 0 && ref.Cluster.Name != "":
		return clusterKey{}, stages.Stalled(fmt.Errorf("kubeConfig.cluster.name: the deployment applies no Cluster API Cluster %q", ref.Cluster.Name))
	case len(found) == 0:
		return clusterKey{}, stages.Stalled(errors.New("kubeConfig.cluster: the deployment applies no Cluster API Cluster whose kubeconfig Secret to use; name a Secret with kubeConfig.secretRef"))
	case len(found) > 1:
		names := make([]string, len(found))
		for i, obj := range found {
			names[i] = obj.GetNamespace() + "/" + obj.GetName()
		}
		return clusterKey{}, stages.Stalled(fmt.Errorf("kubeConfig.cluster: the deployment applies %d Clusters (%s); set kubeConfig.cluster.name", len(found), strings.Join(names, ", ")))
	}
	ns := found[0].GetNamespace()
	if ns == "" {
		ns = cd.Namespace
	}
	return clusterKey{namespace: ns, secret: found[0].GetName() + "-kubeconfig", key: capstanv1.DefaultKubeConfigKey}, nil
}

// get returns the connection to the cluster of the kubeconfig at key for
// deployment cd, reading the Secret (one GET) to see whether it changed.
// A Secret that is missing, lacks the key or holds no usable kubeconfig
// is an UnreachableError naming the Secret and key: the stage waits until
// it is fixed. Errors never quote the Secret's content.
func (c *clusterCache) get(ctx context.Context, cd *capstanv1.ClusterDeployment, key clusterKey) (stages.Cluster, error) {
	user := cd.Namespace + "/" + cd.Name
	name := "Secret " + key.namespace + "/" + key.secret
	secret := &corev1.Secret{}
	err := c.reader.Get(ctx, types.NamespacedName{Namespace: key.namespace, Name: key.secret}, secret)
	switch {
	case apierrors.IsNotFound(err):
		c.drop(key)
		return nil, &stages.UnreachableError{Cluster: name, Err: errors.New("the kubeconfig Secret does not exist")}
	case err != nil:
		return nil, fmt.Errorf("read kubeconfig %s: %w", name, err)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok && e.resourceVersion == secret.ResourceVersion {
		e.users[user] = true
		return e.cluster, nil
	}
	delete(c.entries, key)
	data, ok := secret.Data[key.key]
	if !ok {
		return nil, &stages.UnreachableError{Cluster: name, Err: fmt.Errorf("key %s: not in the Secret (it has %s)", key.key, keyList(secret.Data))}
	}
	cluster, err := stages.NewKubeconfigCluster(name, data, c.scheme)
	if err != nil {
		return nil, &stages.UnreachableError{Cluster: name, Err: fmt.Errorf("key %s: %w", key.key, err)}
	}
	c.entries[key] = &clusterEntry{resourceVersion: secret.ResourceVersion, cluster: cluster, users: map[string]bool{user: true}}
	return cluster, nil
}

func keyList(data map[string][]byte) string {
	if len(data) == 0 {
		return "no keys"
	}
	return "keys " + strings.Join(slices.Sorted(maps.Keys(data)), ", ")
}

func (c *clusterCache) drop(key clusterKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, key)
}

// forget drops deployment namespace/name's share of the connections; a
// connection nobody uses any more is dropped.
func (c *clusterCache) forget(namespace, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, e := range c.entries {
		delete(e.users, namespace+"/"+name)
		if len(e.users) == 0 {
			delete(c.entries, key)
		}
	}
}

// len is how many connections are held, for tests.
func (c *clusterCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// executorFor returns the executor that acts on the cluster stage
// targets: the reconciler's own for the cluster Capstan runs in, else one
// on the connection built from the kubeconfig Secret.
func (r *Reconciler) executorFor(ctx context.Context, cd *capstanv1.ClusterDeployment, stage *stages.Stage, plan *stages.Plan) (*stages.Executor, error) {
	ref := kubeConfigFor(cd, stage)
	if ref == nil || (stage.Action == capstanv1.StageActionPivot && cd.Annotations[pivot.ArrivedAnnotation] != "") {
		// A deployment that moved here needs no connection for its pivot
		// stage: it only takes the deployment over, here.
		if stage.Action == capstanv1.StageActionPivot {
			return r.executor, nil
		}
		return r.local(cd)
	}
	key, err := resolveKubeConfig(cd, ref, plan.AppliedObjects())
	if err != nil {
		return nil, err
	}
	return r.executorVia(ctx, cd, key)
}

// executorVia returns the executor on the cluster of the kubeconfig at
// key, reached for deployment cd.
func (r *Reconciler) executorVia(ctx context.Context, cd *capstanv1.ClusterDeployment, key clusterKey) (*stages.Executor, error) {
	cluster, err := r.clusters.get(ctx, cd, key)
	if err != nil {
		return nil, err
	}
	return r.executor.On(cluster).Via(key.namespace, key.secret, key.key), nil
}

// inventoryKey is the kubeconfig an inventory stage's objects were
// applied through: localRef for the cluster Capstan runs in.
func inventoryKey(s capstanv1.InventoryStage) clusterKey {
	if s.KubeConfig == nil {
		return localRef
	}
	key := clusterKey{namespace: s.KubeConfigNamespace, secret: s.KubeConfig.Name, key: s.KubeConfig.Key}
	if key.key == "" {
		key.key = capstanv1.DefaultKubeConfigKey
	}
	return key
}
