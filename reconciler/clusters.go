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
	"github.com/capstan-dev/capstan/failure"
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
	// rules decide which Secrets a deployment may read and which clusters
	// it may reach (clusters_rules.go).
	rules *kubeconfigRules

	mu      sync.Mutex
	entries map[clusterKey]*clusterEntry
}

// newClusterCache returns a cache reading Secrets through reader. rules
// may be nil: then no deployment is the platform's, none acts as a
// ServiceAccount, and kubeconfigs hold only what connects.
func newClusterCache(reader client.Reader, scheme *runtime.Scheme, rules *kubeconfigRules) *clusterCache {
	if rules == nil {
		rules = &kubeconfigRules{}
	}
	return &clusterCache{reader: reader, scheme: scheme, rules: rules, entries: map[clusterKey]*clusterEntry{}}
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
// the deployment applies (objects), in that Cluster's namespace (which
// the cache refuses unless it is cd's own, or cd is the platform's). A
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
// A Secret in another namespace than cd's is refused before anything is
// read, unless cd is the platform's. A Secret that is missing, lacks the
// key or holds no usable kubeconfig is an UnreachableError naming the
// Secret and key: the stage waits until it is fixed. A kubeconfig with a
// field Capstan does not use from a Secret (exec, tokenFile, a file path,
// insecure-skip-tls-verify), or one that takes a deployment acting as a
// ServiceAccount into the cluster Capstan runs in, is stalled. Errors
// never quote the Secret's content.
func (c *clusterCache) get(ctx context.Context, cd *capstanv1.ClusterDeployment, key clusterKey) (stages.Cluster, error) {
	name := "Secret " + key.namespace + "/" + key.secret
	if err := c.rules.namespaceAllowed(cd, key.namespace, "kubeconfig "+name); err != nil {
		return nil, err
	}
	cluster, err := c.connection(ctx, cd, key)
	if err != nil {
		return nil, err
	}
	if err := c.rules.sameClusterAllowed(ctx, cd, cluster); err != nil {
		return nil, fmt.Errorf("kubeconfig %s key %s: %w", name, key.key, err)
	}
	return cluster, nil
}

// connection returns the connection built from the Secret at key, built
// anew when the Secret changed.
func (c *clusterCache) connection(ctx context.Context, cd *capstanv1.ClusterDeployment, key clusterKey) (stages.Cluster, error) {
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
	cluster, err := stages.NewKubeconfigCluster(name, data, c.scheme, stages.WithKubeconfigPolicy(c.rules.policy))
	if stages.IsKubeconfigRefused(err) {
		return nil, refusedKubeconfig(name, key.key, err)
	}
	if err != nil {
		return nil, &stages.UnreachableError{Cluster: name, Err: fmt.Errorf("key %s: %w", key.key, err)}
	}
	c.entries[key] = &clusterEntry{resourceVersion: secret.ResourceVersion, cluster: cluster, users: map[string]bool{user: true}}
	return cluster, nil
}

// refusedKubeconfig is the stalled error of a kubeconfig with fields
// Capstan does not use from a Secret, naming the Secret and key. It is
// looked at again after refusedRetry: nothing watches the Secret.
func refusedKubeconfig(name, key string, err error) error {
	return &failure.Error{Reason: stages.ReasonKubeconfigRefused, Policy: failure.PolicyStalled, RetryAfter: refusedRetry,
		Err: fmt.Errorf("kubeconfig %s key %s: %w (docs/kubeconfigs.md)", name, key, err)}
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
	if ref.Cluster != nil {
		what := fmt.Sprintf("kubeConfig.cluster: Cluster API Cluster %s/%s (its kubeconfig Secret %s)",
			key.namespace, strings.TrimSuffix(key.secret, "-kubeconfig"), key.secret)
		if err := r.clusters.rules.namespaceAllowed(cd, key.namespace, what); err != nil {
			return nil, err
		}
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
// applied through: localRef for the cluster Capstan runs in. The record
// is status, which whoever may patch the status subresource may write:
// its Secret is in cd's own namespace, whatever the record says, unless
// rules let cd read other namespaces (the platform's) and the record
// names one. Otherwise a record naming another namespace is refused
// (stalled), and nothing is read there.
func inventoryKey(cd *capstanv1.ClusterDeployment, s capstanv1.InventoryStage, rules *kubeconfigRules) (clusterKey, error) {
	if s.KubeConfig == nil {
		return localRef, nil
	}
	key := clusterKey{namespace: cd.Namespace, secret: s.KubeConfig.Name, key: s.KubeConfig.Key}
	if key.key == "" {
		key.key = capstanv1.DefaultKubeConfigKey
	}
	if ns := s.KubeConfigNamespace; ns != "" && ns != cd.Namespace {
		what := "status.inventory stage " + s.Name + ": kubeconfig Secret " + ns + "/" + key.secret
		if err := rules.namespaceAllowed(cd, ns, what); err != nil {
			return clusterKey{}, err
		}
		key.namespace = ns
	}
	return key, nil
}
