// Command workload-clusters serves the API servers and etcd members of the
// workload clusters that Capstan's tests build with the real Cluster API and
// Metal3 controllers, where there are no machines to run them. It uses
// Cluster API's own in-memory API server library
// (sigs.k8s.io/cluster-api/test, test/infrastructure/inmemory/pkg): one
// listener per Cluster on its control-plane endpoint (127.0.0.1:<port>),
// serving certificates from the CA Secrets KCP writes, a fake etcd that
// answers KCP's member list, leader moves and member removal.
//
// It plays the part of each machine once its BareMetalHost is provisioned,
// the way CAPD's in-memory backend does for its fake VMs
// (test/infrastructure/docker/internal/controllers/backends/inmemory):
// a Node, and on control-plane machines the etcd, kube-apiserver,
// kube-scheduler and kube-controller-manager static pods and the kubeadm
// objects; and removes them when the machine goes. Two things differ,
// because of CAPM3 v1.13:
//   - the Node appears when the Metal3Machine's BareMetalHost is
//     provisioned, not when Machine.spec.providerID is set: CAPM3 sets the
//     providerID only after it has found a Node labelled
//     metal3.io/uuid=<BareMetalHost UID> (SetProviderIDFromNodeLabel);
//   - the Node is named after the Machine (kubeadm's nodeRegistration.name
//     from the Metal3DataTemplate) and carries the providerID
//     metal3://<namespace>/<host>/<metal3machine>, CAPM3 v1.13's format.
//
// docs/providers.md says what is real and what is played here.
package main

import (
	"context"
	"flag"
	"os"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	cloudv1 "sigs.k8s.io/cluster-api/test/infrastructure/inmemory/pkg/cloud/api/v1alpha1"
	inmemoryruntime "sigs.k8s.io/cluster-api/test/infrastructure/inmemory/pkg/runtime"
	inmemoryserver "sigs.k8s.io/cluster-api/test/infrastructure/inmemory/pkg/server"
)

const (
	// CAPM3 baremetal.HostAnnotation: "<namespace>/<bmh name>" on the Metal3Machine.
	metal3HostAnnotation = "metal3.io/BareMetalHost"
	// CAPM3 baremetal.ProviderLabelPrefix: Node label whose value is the BMH UID.
	metal3UUIDLabel = "metal3.io/uuid"
	// kubeadm's control plane node label and taint key (KCP labelNodeRoleControlPlane).
	controlPlaneRole = "node-role.kubernetes.io/control-plane"
	// BMO status.provisioning.state value CAPM3 waits for (bmov1alpha1.StateProvisioned).
	bmhStateProvisioned = "provisioned"
)

var (
	metal3MachineGVK = schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "Metal3Machine"}
	bareMetalHostGVK = schema.GroupVersionKind{Group: "metal3.io", Version: "v1alpha1", Kind: "BareMetalHost"}
)

func main() {
	var (
		host       string
		debugPort  int
		withMetal3 bool
		early      bool
		healthAddr string
	)
	// --kubeconfig (the management cluster) is controller-runtime's flag.
	flag.StringVar(&host, "host", "127.0.0.1", "host written in the serving certificates; endpoints must use it")
	flag.IntVar(&debugPort, "debug-port", 0, "port of the mux debug server (0: any free port)")
	flag.BoolVar(&withMetal3, "metal3", true, "watch Metal3Machines and BareMetalHosts (their CRDs must exist)")
	flag.BoolVar(&early, "early-listener", false, "serve an empty workload cluster as soon as <cluster>-ca exists (not in CAPD; saves the ClusterCache's 30s connection retry)")
	flag.StringVar(&healthAddr, "health-addr", "127.0.0.1:0", "address of /readyz and /healthz")
	flag.Parse()

	// The mux logs through controller-runtime's global logger (log.Log).
	ctrl.SetLogger(zap.New(zap.UseDevMode(true)))
	log := ctrl.Log.WithName("workload-clusters")
	ctx := ctrl.SetupSignalHandler()

	// Scheme of the management cluster.
	scheme := runtime.NewScheme()
	must(clientgoscheme.AddToScheme(scheme))
	must(clusterv1.AddToScheme(scheme))

	// Scheme of the fake workload clusters: same list as CAPD's main.go
	// (test/infrastructure/docker/main.go, inmemoryScheme). The API handler
	// decodes requests with it, so every kind a client may create must be in.
	inmemoryScheme := runtime.NewScheme()
	must(cloudv1.AddToScheme(inmemoryScheme))
	must(corev1.AddToScheme(inmemoryScheme))
	must(appsv1.AddToScheme(inmemoryScheme))
	must(rbacv1.AddToScheme(inmemoryScheme))
	must(storagev1.AddToScheme(inmemoryScheme))
	must(apiextensionsv1.AddToScheme(inmemoryScheme))
	must(policyv1.AddToScheme(inmemoryScheme))

	// inmemoryruntime.NewManager(*runtime.Scheme) Manager; Start does not block.
	inMemoryManager := inmemoryruntime.NewManager(inmemoryScheme)
	if err := inMemoryManager.Start(ctx); err != nil {
		fail(log, err, "start in-memory manager")
	}

	// NewWorkloadClustersMux(manager, host, opts...) always opens a debug
	// listener on ":DebugPort" (0 = random free port). Min/MaxPort only matter
	// for InitWorkloadClusterListener(name, 0); explicit ports are used as is.
	mux, err := inmemoryserver.NewWorkloadClustersMux(inMemoryManager, host, inmemoryserver.CustomPorts{
		MinPort:   inmemoryserver.DefaultMinPort,
		MaxPort:   inmemoryserver.DefaultMaxPort,
		DebugPort: int32(debugPort),
	})
	if err != nil {
		fail(log, err, "create workload clusters mux")
	}
	defer func() {
		// The controllers' watches on the fake API servers never end by
		// themselves: give them a moment, then close the listeners.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = mux.Shutdown(ctx)
	}()

	cfg, err := ctrl.GetConfig()
	if err != nil {
		fail(log, err, "load kubeconfig")
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: healthAddr,
	})
	if err != nil {
		fail(log, err, "create manager")
	}
	must(mgr.AddHealthzCheck("ping", healthz.Ping))
	must(mgr.AddReadyzCheck("ping", healthz.Ping))

	st := &state{clusters: map[string]int32{}, machines: map[types.NamespacedName]machineRecord{}}
	cr := &clusterReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), mgr: inMemoryManager, mux: mux, host: host, early: early, st: st}
	if err := ctrl.NewControllerManagedBy(mgr).Named("workload-cluster").
		For(&clusterv1.Cluster{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(cr); err != nil {
		fail(log, err, "create cluster controller")
	}

	mr := &machineReconciler{Client: mgr.GetClient(), clusters: cr, metal3: withMetal3}
	b := ctrl.NewControllerManagedBy(mgr).Named("workload-machine").
		For(&clusterv1.Machine{}).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(mr.clusterToMachines)).
		// One worker: etcd member/cluster IDs are allocated from the pod list.
		WithOptions(controller.Options{MaxConcurrentReconciles: 1})
	if withMetal3 {
		m3m := &unstructured.Unstructured{}
		m3m.SetGroupVersionKind(metal3MachineGVK)
		bmh := &unstructured.Unstructured{}
		bmh.SetGroupVersionKind(bareMetalHostGVK)
		b = b.Watches(m3m, handler.EnqueueRequestsFromMapFunc(ownerMachine)).
			Watches(bmh, handler.EnqueueRequestsFromMapFunc(mr.hostToMachine))
	}
	if err := b.Complete(mr); err != nil {
		fail(log, err, "create machine controller")
	}

	if err := mgr.Start(ctx); err != nil {
		fail(log, err, "run manager")
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func fail(log logr.Logger, err error, msg string) {
	log.Error(err, msg)
	os.Exit(1)
}
