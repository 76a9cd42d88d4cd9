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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
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
// the deployments of the Secret's namespace that use it.
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
// else the deployment's; nil for the cluster Capstan runs in.
func kubeConfigFor(cd *capstanv1.ClusterDeployment, stage *stages.Stage) *capstanv1.KubeConfigReference {
	if stage.KubeConfig != nil {
		return stage.KubeConfig
	}
	return cd.Spec.KubeConfig
}

// get returns the connection ref names for deployment cd, reading the
// Secret (one GET) to see whether it changed. A Secret that is missing,
// lacks the key or holds no usable kubeconfig is an UnreachableError
// naming the Secret and key: the stage waits until it is fixed. Errors
// never quote the Secret's content.
func (c *clusterCache) get(ctx context.Context, cd *capstanv1.ClusterDeployment, ref *capstanv1.KubeConfigReference) (stages.Cluster, error) {
	key := clusterKey{namespace: cd.Namespace, secret: ref.SecretRef.Name, key: ref.SecretRef.Key}
	if key.key == "" {
		key.key = capstanv1.DefaultKubeConfigKey
	}
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
		e.users[cd.Name] = true
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
	c.entries[key] = &clusterEntry{resourceVersion: secret.ResourceVersion, cluster: cluster, users: map[string]bool{cd.Name: true}}
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
		if key.namespace != namespace {
			continue
		}
		delete(e.users, name)
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
func (r *Reconciler) executorFor(ctx context.Context, cd *capstanv1.ClusterDeployment, stage *stages.Stage) (*stages.Executor, error) {
	ref := kubeConfigFor(cd, stage)
	if ref == nil {
		return r.executor, nil
	}
	cluster, err := r.clusters.get(ctx, cd, ref)
	if err != nil {
		return nil, err
	}
	return r.executor.On(cluster), nil
}
