package main

import (
	"context"
	"fmt"
	"strings"

	pkgerrors "github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
)

// ---------------------------------------------------------------------------
// Machine: Node, etcd member, static pods, kubeadm objects
// (inmemorymachine_backend.go reconcileNormalNode/ETCD/APIServer/Scheduler/
// ControllerManager/KubeadmObjects and reconcileDelete*).

type machineReconciler struct {
	client.Client
	clusters *clusterReconciler
	metal3   bool
}

func (r *machineReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)

	machine := &clusterv1.Machine{}
	if err := r.Get(ctx, req.NamespacedName, machine); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, r.cleanup(ctx, req.NamespacedName)
		}
		return reconcile.Result{}, err
	}
	cluster := &clusterv1.Cluster{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: machine.Namespace, Name: machine.Spec.ClusterName}, cluster); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if _, ok := localEndpoint(cluster, r.clusters.host); !ok {
		return reconcile.Result{}, nil
	}
	if err := r.clusters.ensure(ctx, cluster); err != nil {
		return reconcile.Result{}, err
	}

	if !machine.DeletionTimestamp.IsZero() {
		// CAPD cleans up in the infra machine's ReconcileDelete, i.e. after the
		// Machine controller has drained, run the pre-terminate hooks (KCP's
		// pre-terminate.delete.hook.machine.cluster.x-k8s.io/kcp-cleanup, which
		// moves etcd leadership and calls MemberRemove) and deleted the infra
		// machine. Mirror that: clean up once the infra machine is deleting/gone.
		gone, err := r.infraMachineDeletingOrGone(ctx, machine)
		if err != nil || !gone {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, r.cleanup(ctx, req.NamespacedName)
	}

	t, ready, err := r.nodeTarget(ctx, machine)
	if err != nil || !ready {
		return reconcile.Result{}, err
	}

	resourceGroup, listenerName := names(client.ObjectKeyFromObject(cluster))
	c := r.clusters.mgr.GetResourceGroup(resourceGroup).GetClient()
	cp := util.IsControlPlaneMachine(machine)

	r.clusters.st.Lock()
	r.clusters.st.machines[req.NamespacedName] = machineRecord{cluster: client.ObjectKeyFromObject(cluster), nodeName: t.name, controlPlane: cp}
	r.clusters.st.Unlock()

	if err := r.ensureNode(ctx, c, machine, t, cp); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.announceNode(ctx, t); err != nil {
		return reconcile.Result{}, err
	}
	if !cp {
		return reconcile.Result{}, nil
	}
	if err := r.ensureEtcd(ctx, c, cluster, listenerName, t.name); err != nil {
		return reconcile.Result{}, err
	}
	for _, component := range []string{"kube-controller-manager", "kube-scheduler"} {
		if err := createIfMissing(ctx, c, staticPod(component, t.name)); err != nil {
			return reconcile.Result{}, err
		}
	}
	if err := ensureKubeadmObjects(ctx, c); err != nil {
		return reconcile.Result{}, err
	}
	// Last: the first AddAPIServer starts the listener, so KCP/CAPM3 never see
	// a cluster without its Node, etcd pod and kubeadm-config.
	if err := r.ensureAPIServer(ctx, c, cluster, listenerName, t.name); err != nil {
		return reconcile.Result{}, err
	}
	log.V(4).Info("workload cluster objects in place", "node", t.name, "providerID", t.providerID)
	return reconcile.Result{}, nil
}

type nodeTarget struct {
	name       string
	providerID string
	labels     map[string]string
	// metal3Machine is the machine's Metal3Machine, when it has one.
	metal3Machine *unstructured.Unstructured
}

// nodeTarget decides whether the Machine's "host" is up and what its Node looks like.
func (r *machineReconciler) nodeTarget(ctx context.Context, machine *clusterv1.Machine) (nodeTarget, bool, error) {
	t := nodeTarget{name: machine.Name, providerID: machine.Spec.ProviderID, labels: map[string]string{}}
	if !r.metal3 || machine.Spec.InfrastructureRef.Kind != metal3MachineGVK.Kind {
		// Generic infrastructure: the providerID is the signal (CAPD in-memory
		// sets spec.providerID when its "VM" is provisioned).
		return t, t.providerID != "", nil
	}

	m3m := &unstructured.Unstructured{}
	m3m.SetGroupVersionKind(metal3MachineGVK)
	if err := r.Get(ctx, client.ObjectKey{Namespace: machine.Namespace, Name: machine.Spec.InfrastructureRef.Name}, m3m); err != nil {
		return t, false, client.IgnoreNotFound(err)
	}
	hostRef := m3m.GetAnnotations()[metal3HostAnnotation] // "<ns>/<bmh>"
	parts := strings.Split(hostRef, "/")
	if len(parts) != 2 || parts[0] != m3m.GetNamespace() {
		return t, false, nil // not associated yet
	}
	bmh := &unstructured.Unstructured{}
	bmh.SetGroupVersionKind(bareMetalHostGVK)
	if err := r.Get(ctx, client.ObjectKey{Namespace: parts[0], Name: parts[1]}, bmh); err != nil {
		return t, false, client.IgnoreNotFound(err)
	}
	provState, _, _ := unstructured.NestedString(bmh.Object, "status", "provisioning", "state")
	if provState != bmhStateProvisioned && t.providerID == "" {
		return t, false, nil
	}
	// The label CAPM3 looks the Node up by (SetProviderIDFromNodeLabel).
	t.labels[metal3UUIDLabel] = string(bmh.GetUID())
	t.metal3Machine = m3m
	if t.providerID == "" {
		if pid, _, _ := unstructured.NestedString(m3m.Object, "spec", "providerID"); pid != "" {
			t.providerID = pid
		} else {
			// CAPM3 SetDefaultProviderID / providerIDNew format. With the node
			// already carrying it, CAPM3 takes the "providerIDOnNode ==
			// providerIDNew" branch and marks the Metal3Machine provisioned.
			t.providerID = fmt.Sprintf("metal3://%s/%s/%s", m3m.GetNamespace(), parts[1], m3m.GetName())
		}
	}
	return t, true, nil
}

// nodeAnnotation marks a Metal3Machine whose Node workload-clusters has
// registered.
const nodeAnnotation = "workload-clusters.capstan.dev/node"

// announceNode wakes CAPM3 up once the machine's Node exists. CAPM3 looks
// for the Node when BMO reports the host provisioned, the same moment
// the Node appears here; when it looked first, it only looks again after
// 30 s (a kubelet takes minutes to register, so real clusters never
// notice). An annotation on the Metal3Machine is an event CAPM3 reacts to
// at once, so the walk does not wait out that timer.
func (r *machineReconciler) announceNode(ctx context.Context, t nodeTarget) error {
	m3m := t.metal3Machine
	if m3m == nil || m3m.GetAnnotations()[nodeAnnotation] == t.name {
		return nil
	}
	if pid, _, _ := unstructured.NestedString(m3m.Object, "spec", "providerID"); pid != "" {
		return nil
	}
	patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, nodeAnnotation, t.name))
	if err := r.Patch(ctx, m3m, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return pkgerrors.Wrapf(err, "failed to annotate Metal3Machine %s", m3m.GetName())
	}
	return nil
}

func (r *machineReconciler) infraMachineDeletingOrGone(ctx context.Context, machine *clusterv1.Machine) (bool, error) {
	ref := machine.Spec.InfrastructureRef
	if ref.Name == "" {
		return true, nil
	}
	obj := &unstructured.Unstructured{}
	// GUESS: version of the infra kind; only Metal3Machine is known here.
	gvk := schema.GroupVersionKind{Group: ref.APIGroup, Version: "v1beta2", Kind: ref.Kind}
	if ref.Kind == metal3MachineGVK.Kind {
		gvk = metal3MachineGVK
	}
	obj.SetGroupVersionKind(gvk)
	if err := r.Get(ctx, client.ObjectKey{Namespace: machine.Namespace, Name: ref.Name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}
	return !obj.GetDeletionTimestamp().IsZero(), nil
}

// ensureNode mirrors reconcileNormalNode, plus the CAPM3 label/providerID.
func (r *machineReconciler) cleanup(ctx context.Context, key types.NamespacedName) error {
	r.clusters.st.Lock()
	rec, ok := r.clusters.st.machines[key]
	r.clusters.st.Unlock()
	if !ok {
		return nil
	}
	resourceGroup, listenerName := names(rec.cluster)
	c := r.clusters.mgr.GetResourceGroup(resourceGroup).GetClient()
	del := func(obj client.Object) error {
		if err := c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			return pkgerrors.Wrapf(err, "failed to delete %s", obj.GetName())
		}
		return nil
	}
	if err := del(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: rec.nodeName}}); err != nil {
		return err
	}
	if rec.controlPlane {
		for _, component := range []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"} {
			if err := del(staticPod(component, rec.nodeName)); err != nil {
				return err
			}
		}
		if err := r.clusters.mux.DeleteEtcdMember(listenerName, "etcd-"+rec.nodeName); err != nil {
			return err
		}
		if err := r.clusters.mux.DeleteAPIServer(listenerName, "kube-apiserver-"+rec.nodeName); err != nil {
			return err
		}
	}
	r.clusters.st.Lock()
	delete(r.clusters.st.machines, key)
	r.clusters.st.Unlock()
	return nil
}

// ---------------------------------------------------------------------------
// Mappers.

func (r *machineReconciler) clusterToMachines(ctx context.Context, obj client.Object) []reconcile.Request {
	machines := &clusterv1.MachineList{}
	if err := r.List(ctx, machines, client.InNamespace(obj.GetNamespace()),
		client.MatchingLabels{clusterv1.ClusterNameLabel: obj.GetName()}); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(machines.Items))
	for i := range machines.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&machines.Items[i])})
	}
	return reqs
}

// ownerMachine maps a Metal3Machine to the Machine that owns it.
func ownerMachine(_ context.Context, obj client.Object) []reconcile.Request {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.Kind == "Machine" && strings.HasPrefix(ref.APIVersion, clusterv1.GroupVersion.Group+"/") {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: ref.Name}}}
		}
	}
	return nil
}

// hostToMachine maps a BareMetalHost to its Machine through spec.consumerRef
// (the Metal3Machine, set by CAPM3 on association).
func (r *machineReconciler) hostToMachine(ctx context.Context, obj client.Object) []reconcile.Request {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil
	}
	kind, _, _ := unstructured.NestedString(u.Object, "spec", "consumerRef", "kind")
	name, _, _ := unstructured.NestedString(u.Object, "spec", "consumerRef", "name")
	ns, _, _ := unstructured.NestedString(u.Object, "spec", "consumerRef", "namespace")
	if kind != metal3MachineGVK.Kind || name == "" {
		return nil
	}
	if ns == "" {
		ns = u.GetNamespace()
	}
	m3m := &unstructured.Unstructured{}
	m3m.SetGroupVersionKind(metal3MachineGVK)
	if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m3m); err != nil {
		return nil
	}
	return ownerMachine(ctx, m3m)
}
