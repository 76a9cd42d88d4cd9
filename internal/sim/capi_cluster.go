package sim

import (
	"errors"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Labels and annotations of the Cluster API contract.
const (
	clusterNameLabel      = "cluster.x-k8s.io/cluster-name"
	controlPlaneLabel     = "cluster.x-k8s.io/control-plane"
	controlPlaneNameLabel = "cluster.x-k8s.io/control-plane-name"
	deploymentNameLabel   = "cluster.x-k8s.io/deployment-name"
	setNameLabel          = "cluster.x-k8s.io/set-name"
	templateHashLabel     = "machine-template-hash"
	pausedAnnotation      = "cluster.x-k8s.io/paused"
	clonedFromAnnotation  = "cluster.x-k8s.io/cloned-from-name"
	clonedKindAnnotation  = "cluster.x-k8s.io/cloned-from-groupkind"
)

// clusterOf returns the Cluster obj belongs to: by the cluster-name
// label, spec.clusterName or an owner reference.
func (p *pass) clusterOf(obj *unstructured.Unstructured) *unstructured.Unstructured {
	if obj == nil {
		return nil
	}
	if c := p.w.get(kindCluster, obj.GetLabels()[clusterNameLabel]); c != nil {
		return c
	}
	if c := p.w.get(kindCluster, str(obj.Object, "spec", "clusterName")); c != nil {
		return c
	}
	return p.ownerCluster(obj)
}

func (p *pass) ownerCluster(obj *unstructured.Unstructured) *unstructured.Unstructured {
	for _, r := range obj.GetOwnerReferences() {
		if r.Kind == "Cluster" {
			if c := p.w.byUID(kindCluster, r.UID); c != nil {
				return c
			}
		}
	}
	return nil
}

// infraOf returns the Metal3Cluster a Cluster's infrastructureRef names.
func (p *pass) infraOf(cluster *unstructured.Unstructured) *unstructured.Unstructured {
	if cluster == nil || str(cluster.Object, "spec", "infrastructureRef", "kind") != kindMetal3Cluster.Kind {
		return nil
	}
	return p.w.get(kindMetal3Cluster, str(cluster.Object, "spec", "infrastructureRef", "name"))
}

func (p *pass) infraProvisioned(cluster *unstructured.Unstructured) bool {
	infra := p.infraOf(cluster)
	return infra != nil && flag(infra.Object, "status", "initialization", "provisioned")
}

// controlPlaneOf returns the KubeadmControlPlane a Cluster's
// controlPlaneRef names.
func (p *pass) controlPlaneOf(cluster *unstructured.Unstructured) *unstructured.Unstructured {
	if cluster == nil || str(cluster.Object, "spec", "controlPlaneRef", "kind") != kindKubeadmControlPlane.Kind {
		return nil
	}
	return p.w.get(kindKubeadmControlPlane, str(cluster.Object, "spec", "controlPlaneRef", "name"))
}

// clusterPaused reports whether Cluster API and the providers leave the
// cluster alone, as during a pivot.
func clusterPaused(cluster *unstructured.Unstructured) bool {
	_, annotated := cluster.GetAnnotations()[pausedAnnotation]
	return annotated || flag(cluster.Object, "spec", "paused")
}

func endpointSet(obj *unstructured.Unstructured) bool {
	port, _ := integer(obj.Object, "spec", "controlPlaneEndpoint", "port")
	return str(obj.Object, "spec", "controlPlaneEndpoint", "host") != "" && port != 0
}

// reconcileClusters plays the Cluster controller: it adopts the
// Metal3Cluster and the control plane, copies the control-plane endpoint
// and sums up infrastructure, control plane and workers in the Cluster's
// status.
func (p *pass) reconcileClusters() error {
	var errs []error
	for _, c := range p.w.list(kindCluster) {
		if c.GetDeletionTimestamp() != nil {
			continue
		}
		if err := p.adoptClusterParts(c); err != nil {
			errs = append(errs, err)
			continue
		}
		c = p.w.get(kindCluster, c.GetName())
		if err := p.clusterStatus(c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// adoptClusterParts sets the owner references Cluster API sets (seed 002,
// steps 1 and 4) and copies the endpoint CAPM3 accepted into the Cluster.
func (p *pass) adoptClusterParts(c *unstructured.Unstructured) error {
	if clusterPaused(c) {
		return nil
	}
	for _, part := range []*unstructured.Unstructured{p.infraOf(c), p.controlPlaneOf(c)} {
		if part == nil || hasOwner(part, c) {
			continue
		}
		a := newObject(part.GroupVersionKind(), part.GetNamespace(), part.GetName())
		a.SetOwnerReferences([]metav1.OwnerReference{ownerRef(c, true)})
		if err := p.apply(controllerCAPI, a); err != nil {
			return err
		}
		p.emit(controllerCAPI, part, "owned by Cluster %s", c.GetName())
	}
	infra := p.infraOf(c)
	if endpointSet(c) || infra == nil || !p.infraProvisioned(c) || !endpointSet(infra) {
		return nil
	}
	a := newObject(kindCluster, c.GetNamespace(), c.GetName())
	set(a.Object, object(infra.Object, "spec", "controlPlaneEndpoint"), "spec", "controlPlaneEndpoint")
	if err := p.apply(controllerCAPI, a); err != nil {
		return err
	}
	p.emit(controllerCAPI, c, "control-plane endpoint %s:%v copied from Metal3Cluster %s",
		str(infra.Object, "spec", "controlPlaneEndpoint", "host"), object(infra.Object, "spec", "controlPlaneEndpoint")["port"], infra.GetName())
	return nil
}

func (p *pass) clusterStatus(c *unstructured.Unstructured) error {
	next := c.DeepCopy()
	set(next.Object, c.GetGeneration(), "status", "observedGeneration")
	if clusterPaused(c) {
		setConditions(next, p.now, condition{typ: "Paused", status: "True", reason: "Paused"})
		_, err := p.updateStatus(controllerCAPI, c, next)
		return err
	}
	infra, kcp := p.infraOf(c), p.controlPlaneOf(c)
	infraReady := p.infraProvisioned(c) || flag(c.Object, "status", "initialization", "infrastructureProvisioned")
	cpInit := kcp != nil && flag(kcp.Object, "status", "initialization", "controlPlaneInitialized") ||
		flag(c.Object, "status", "initialization", "controlPlaneInitialized")
	if infraReady {
		set(next.Object, true, "status", "initialization", "infrastructureProvisioned")
	}
	if cpInit {
		set(next.Object, true, "status", "initialization", "controlPlaneInitialized")
	}
	phase := "Pending"
	switch {
	case infraReady && endpointSet(c):
		phase = "Provisioned"
	case infra != nil:
		phase = "Provisioning"
	}
	set(next.Object, phase, "status", "phase")

	probe := conditionTrue(c, "RemoteConnectionProbe") || cpInit && p.waited(c, "probe", p.s.delays.Default)
	cpAvailable := conditionTrue(kcp, "Available")
	workers, workersAvailable, workersMsg := p.workersOf(c)
	set(next.Object, replicaSummary(kcp), "status", "controlPlane")
	set(next.Object, workers, "status", "workers")

	cpMachines, workerMachines := p.clusterMachines(c)
	available := infraReady && cpAvailable && workersAvailable && probe
	setConditions(next, p.now,
		conditionIf(infraReady, "InfrastructureReady", "Ready", "NotReady", "Metal3Cluster is not provisioned yet"),
		conditionIf(cpInit, "ControlPlaneInitialized", "Initialized", "NotInitialized", "control plane not yet initialized"),
		conditionIf(cpAvailable, "ControlPlaneAvailable", "Available", "NotAvailable", "control plane is not available"),
		conditionIf(workersAvailable, "WorkersAvailable", "Available", "NotAvailable", workersMsg),
		conditionIf(probe, "RemoteConnectionProbe", "ProbeSucceeded", "ProbeFailed", "the workload cluster's API server is not reachable yet"),
		conditionIf(allMachines(cpMachines, "Ready"), "ControlPlaneMachinesReady", "Ready", "NotReady", ""),
		conditionIf(allMachines(workerMachines, "Ready"), "WorkerMachinesReady", "Ready", "NotReady", ""),
		conditionIf(allMachines(cpMachines, "UpToDate"), "ControlPlaneMachinesUpToDate", "UpToDate", "NotUpToDate", ""),
		conditionIf(allMachines(workerMachines, "UpToDate"), "WorkerMachinesUpToDate", "UpToDate", "NotUpToDate", ""),
		condition{typ: "RollingOut", status: "False", reason: "NotRollingOut"},
		condition{typ: "ScalingUp", status: "False", reason: "NotScalingUp"},
		condition{typ: "ScalingDown", status: "False", reason: "NotScalingDown"},
		condition{typ: "Remediating", status: "False", reason: "NotRemediating"},
		condition{typ: "Deleting", status: "False", reason: "NotDeleting"},
		notPaused,
		conditionIf(available, "Available", "Available", "NotAvailable", "waiting for infrastructure, control plane, workers and the API server"),
	)
	wrote, err := p.updateStatus(controllerCAPI, c, next)
	if err != nil || !wrote {
		return err
	}
	for _, e := range []struct {
		now, was bool
		msg      string
	}{
		{infraReady, flag(c.Object, "status", "initialization", "infrastructureProvisioned"), "infrastructure provisioned"},
		{cpInit, flag(c.Object, "status", "initialization", "controlPlaneInitialized"), "control plane initialized"},
		{probe, conditionTrue(c, "RemoteConnectionProbe"), "API server of the workload cluster reachable"},
		{available, conditionTrue(c, "Available"), "Available"},
	} {
		if e.now && !e.was {
			p.emit(controllerCAPI, next, "%s", e.msg)
		}
	}
	if !available && conditionTrue(c, "Available") {
		p.emit(controllerCAPI, next, "no longer Available")
	}
	return nil
}

// workersOf sums the Cluster's MachineDeployments up for status.workers,
// and says whether every one is Available.
func (p *pass) workersOf(c *unstructured.Unstructured) (summary map[string]any, available bool, msg string) {
	summary = map[string]any{}
	available = true
	count := 0
	var versions []*unstructured.Unstructured
	for _, md := range p.w.list(kindMachineDeployment) {
		if str(md.Object, "spec", "clusterName") != c.GetName() {
			continue
		}
		count++
		for k, v := range replicaSummary(md) {
			if n, ok := v.(int64); ok {
				prev, _ := summary[k].(int64)
				summary[k] = prev + n
			}
		}
		versions = append(versions, md)
		if !conditionTrue(md, "Available") {
			available = false
			msg = "MachineDeployment " + md.GetName() + " is not available"
		}
	}
	if vs := mergeVersions(versions); len(vs) > 0 {
		summary["versions"] = vs
	}
	if count == 0 {
		return summary, true, ""
	}
	return summary, available, msg
}

// replicaSummary is the status.controlPlane or a term of status.workers
// of a Cluster: the replica counters of a control plane or deployment.
func replicaSummary(obj *unstructured.Unstructured) map[string]any {
	out := map[string]any{}
	if obj == nil {
		return out
	}
	desired, ok := integer(obj.Object, "spec", "replicas")
	if !ok {
		desired = 1
	}
	out["desiredReplicas"] = desired
	for _, f := range []string{"replicas", "readyReplicas", "availableReplicas", "upToDateReplicas"} {
		if n, ok := integer(obj.Object, "status", f); ok {
			out[f] = n
		}
	}
	if vs := mergeVersions([]*unstructured.Unstructured{obj}); len(vs) > 0 && obj.GetKind() == kindKubeadmControlPlane.Kind {
		out["versions"] = vs
	}
	return out
}

// mergeVersions adds up status.versions of several objects.
func mergeVersions(objs []*unstructured.Unstructured) []any {
	counts := map[string]int64{}
	var order []string
	for _, o := range objs {
		vs, _, _ := unstructured.NestedSlice(o.Object, "status", "versions")
		for _, v := range vs {
			m, _ := v.(map[string]any)
			ver := str(m, "version")
			n, _ := integer(m, "replicas")
			if _, seen := counts[ver]; !seen {
				order = append(order, ver)
			}
			counts[ver] += n
		}
	}
	out := make([]any, 0, len(order))
	for _, v := range order {
		out = append(out, versionEntry(v, counts[v]))
	}
	return out
}

func versionEntry(version string, n int64) map[string]any {
	e := map[string]any{"version": version}
	if n > 0 {
		e["replicas"] = n
	}
	return e
}

// clusterMachines returns the Cluster's control-plane and worker Machines.
func (p *pass) clusterMachines(c *unstructured.Unstructured) (controlPlane, workers []*unstructured.Unstructured) {
	for _, m := range p.w.list(kindMachine) {
		if m.GetLabels()[clusterNameLabel] != c.GetName() && str(m.Object, "spec", "clusterName") != c.GetName() {
			continue
		}
		if _, cp := m.GetLabels()[controlPlaneLabel]; cp {
			controlPlane = append(controlPlane, m)
		} else {
			workers = append(workers, m)
		}
	}
	return controlPlane, workers
}

func allMachines(machines []*unstructured.Unstructured, cond string) bool {
	for _, m := range machines {
		if !conditionTrue(m, cond) {
			return false
		}
	}
	return true
}
