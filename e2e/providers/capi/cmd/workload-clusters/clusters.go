package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	pkgerrors "github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	inmemoryruntime "sigs.k8s.io/cluster-api/test/infrastructure/inmemory/pkg/runtime"
	inmemoryserver "sigs.k8s.io/cluster-api/test/infrastructure/inmemory/pkg/server"
	"sigs.k8s.io/cluster-api/util/secret"
)

// ---------------------------------------------------------------------------
// Shared state. The fake clusters live only in memory: after a restart they
// are rebuilt from the Machines (new etcd IDs, which KCP tolerates).

type machineRecord struct {
	cluster      types.NamespacedName
	nodeName     string
	controlPlane bool
}

type state struct {
	sync.Mutex
	clusters map[string]int32 // listener name -> port
	machines map[types.NamespacedName]machineRecord
}

// names returns the resource group and listener name of a Cluster; CAPD uses
// klog.KObj(cluster).String() ("ns/name") for both.
func names(cluster client.ObjectKey) (resourceGroup, listenerName string) {
	s := klog.KRef(cluster.Namespace, cluster.Name).String()
	return s, s
}

// localEndpoint returns the port of a control plane endpoint served here.
func localEndpoint(cluster *clusterv1.Cluster, host string) (int32, bool) {
	ep := cluster.Spec.ControlPlaneEndpoint
	if ep.Port <= 0 {
		return 0, false
	}
	switch ep.Host {
	case host, "127.0.0.1", "localhost", "::1":
		return ep.Port, true
	}
	return 0, false
}

// ---------------------------------------------------------------------------
// Cluster: resource group + listener (inmemorycluster_backend.go ReconcileNormal/ReconcileDelete).

type clusterReconciler struct {
	client.Client
	APIReader client.Reader // Secrets are read uncached (no cluster-wide Secret informer)
	mgr       inmemoryruntime.Manager
	mux       *inmemoryserver.WorkloadClustersMux
	host      string
	early     bool
	st        *state
}

// placeholderAPIServer is the pod name registered by --early-listener; it has
// no Pod object, so KCP never sees it.
const placeholderAPIServer = "kube-apiserver-placeholder"

func (r *clusterReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	cluster := &clusterv1.Cluster{}
	if err := r.Get(ctx, req.NamespacedName, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, r.forget(req.NamespacedName)
		}
		return reconcile.Result{}, err
	}
	if !cluster.DeletionTimestamp.IsZero() {
		// Keep serving while CAPI deletes the Machines; forget once gone.
		return reconcile.Result{}, nil
	}
	if _, ok := localEndpoint(cluster, r.host); !ok {
		return reconcile.Result{}, nil
	}
	if err := r.ensure(ctx, cluster); err != nil {
		return reconcile.Result{}, err
	}
	if !r.early {
		return reconcile.Result{}, nil
	}
	// Not in CAPD: start serving (an empty cluster) before the first control
	// plane host is up, so the ClusterCache's first connection succeeds
	// instead of backing off ConnectionCreationRetryInterval (30s). KCP still
	// waits for kubeadm-config before calling the control plane initialized.
	_, listenerName := names(req.NamespacedName)
	if r.mux.HasAPIServer(listenerName, placeholderAPIServer) {
		return reconcile.Result{}, nil
	}
	cert, key, err := loadCA(ctx, r.APIReader, cluster, secret.ClusterCA)
	if err != nil {
		// KCP writes <cluster>-ca on its first reconcile.
		return reconcile.Result{RequeueAfter: 2 * time.Second}, nil
	}
	return reconcile.Result{}, r.mux.AddAPIServer(listenerName, placeholderAPIServer, cert, key)
}

// ensure creates the resource group (with the default Namespaces) and
// initialises the listener on the Cluster's own port; the listener starts
// serving when the first API server is added (mux.AddAPIServer).
func (r *clusterReconciler) ensure(ctx context.Context, cluster *clusterv1.Cluster) error {
	port, ok := localEndpoint(cluster, r.host)
	if !ok {
		return fmt.Errorf("cluster %s: control plane endpoint %v is not on %s", klog.KObj(cluster), cluster.Spec.ControlPlaneEndpoint, r.host)
	}
	resourceGroup, listenerName := names(client.ObjectKeyFromObject(cluster))

	r.st.Lock()
	defer r.st.Unlock()
	if old, ok := r.st.clusters[listenerName]; ok && old != port {
		// InitWorkloadClusterListener returns the existing listener whatever
		// the port: drop it first when the endpoint moved.
		if err := r.mux.DeleteWorkloadClusterListener(listenerName); err != nil {
			return err
		}
		delete(r.st.clusters, listenerName)
	}

	r.mgr.AddResourceGroup(resourceGroup) // no-op if it exists
	c := r.mgr.GetResourceGroup(resourceGroup).GetClient()
	for _, ns := range []string{metav1.NamespaceDefault, metav1.NamespacePublic, metav1.NamespaceSystem} {
		obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"kubernetes.io/metadata.name": ns}}}
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return pkgerrors.Wrapf(err, "failed to create %s Namespace", ns)
		}
	}

	// InitWorkloadClusterListener(wclName string, port int32) (*WorkloadClusterListener, error):
	// port != 0 is taken as given (it only bumps the auto-allocation index).
	if _, err := r.mux.InitWorkloadClusterListener(listenerName, port); err != nil {
		return pkgerrors.Wrap(err, "failed to init the listener for the workload cluster")
	}
	if err := r.mux.RegisterResourceGroup(listenerName, resourceGroup); err != nil {
		return pkgerrors.Wrap(err, "failed to register the resource group for the workload cluster")
	}
	r.st.clusters[listenerName] = port
	return nil
}

func (r *clusterReconciler) forget(key types.NamespacedName) error {
	resourceGroup, listenerName := names(key)
	r.st.Lock()
	defer r.st.Unlock()
	if _, ok := r.st.clusters[listenerName]; !ok {
		return nil
	}
	r.mgr.DeleteResourceGroup(resourceGroup)
	if err := r.mux.DeleteWorkloadClusterListener(listenerName); err != nil {
		return err
	}
	delete(r.st.clusters, listenerName)
	return nil
}
