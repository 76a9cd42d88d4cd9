package sim

import (
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// reconcileControlPlanes plays the kubeadm control-plane provider (KCP):
// once the Cluster's infrastructure is provisioned it creates the first
// machine, and after the control plane is initialized the others, one at a
// time, each only when every machine before it is ready. A changed version
// or machine template is rolled out by replacing machines one at a time:
// a new machine first (maxSurge 1, the default), or an old one deleted
// first (maxSurge 0, how a Metal3 cluster without spare hosts upgrades).
func (p *pass) reconcileControlPlanes() error {
	var errs []error
	for _, kcp := range p.w.list(kindKubeadmControlPlane) {
		if kcp.GetDeletionTimestamp() != nil {
			continue
		}
		cluster := p.clusterOfControlPlane(kcp)
		if cluster != nil && clusterPaused(cluster) {
			continue
		}
		if err := p.writeKubeconfig(kcp, cluster); err != nil {
			errs = append(errs, err)
		}
		if err := p.scaleControlPlane(kcp, cluster); err != nil {
			errs = append(errs, err)
		}
		if err := p.controlPlaneStatus(p.w.get(kindKubeadmControlPlane, kcp.GetName()), cluster); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// clusterOfControlPlane returns the Cluster whose controlPlaneRef names kcp.
func (p *pass) clusterOfControlPlane(kcp *unstructured.Unstructured) *unstructured.Unstructured {
	for _, c := range p.w.list(kindCluster) {
		if p.controlPlaneOf(c) == kcp {
			return c
		}
	}
	return nil
}

func desiredReplicas(obj *unstructured.Unstructured) int64 {
	if n, ok := integer(obj.Object, "spec", "replicas"); ok {
		return n
	}
	return 1
}

// scaleControlPlane takes at most one step: create or delete one machine.
func (p *pass) scaleControlPlane(kcp, cluster *unstructured.Unstructured) error {
	if cluster == nil || !p.infraProvisioned(cluster) || !endpointSet(cluster) {
		return nil
	}
	tmpl := p.w.get(kindMetal3MachineTemplate, str(kcp.Object, "spec", "machineTemplate", "spec", "infrastructureRef", "name"))
	if tmpl == nil {
		return nil
	}
	machines := p.w.owned(kindMachine, kcp)
	for _, m := range machines {
		if !conditionTrue(m, "Ready") {
			return nil // one machine at a time: wait for this one
		}
	}
	desired := desiredReplicas(kcp)
	n := int64(len(machines))
	initialized := flag(kcp.Object, "status", "initialization", "controlPlaneInitialized")
	var outdated []*unstructured.Unstructured
	for _, m := range machines {
		if !p.machineUpToDate(m) {
			outdated = append(outdated, m)
		}
	}
	surge := int64(1)
	if ms := object(kcp.Object, "spec", "rollout", "strategy", "rollingUpdate"); ms != nil {
		if v, ok := ms["maxSurge"]; ok {
			s, err := intstr.GetScaledValueFromIntOrPercent(intOrString(v), int(desired), true)
			if err == nil && s == 0 && desired >= 3 {
				surge = 0 // fewer than three machines cannot lose one
			}
		}
	}
	switch {
	case n == 0:
		return p.createControlPlaneMachine(kcp, cluster, tmpl, true, "first")
	case !initialized:
		return nil
	case n < desired:
		return p.createControlPlaneMachine(kcp, cluster, tmpl, false, fmt.Sprintf("%d of %d", n+1, desired))
	case len(outdated) > 0 && n < desired+surge:
		return p.createControlPlaneMachine(kcp, cluster, tmpl, false, "rollout")
	case len(outdated) > 0:
		return p.deleteMachine(controllerKCP, outdated[0], "rollout: replaced by a machine at "+str(kcp.Object, "spec", "version"))
	case n > desired:
		return p.deleteMachine(controllerKCP, machines[0], fmt.Sprintf("scale down to %d", desired))
	}
	return nil
}

func intOrString(v any) *intstr.IntOrString {
	switch t := v.(type) {
	case string:
		return &intstr.IntOrString{Type: intstr.String, StrVal: t}
	case int64:
		return &intstr.IntOrString{Type: intstr.Int, IntVal: int32(t)}
	case float64:
		return &intstr.IntOrString{Type: intstr.Int, IntVal: int32(t)}
	}
	return &intstr.IntOrString{}
}

// createControlPlaneMachine creates a control-plane machine whose
// KubeadmConfig holds the init configuration for the first machine and the
// join configuration for the others.
func (p *pass) createControlPlaneMachine(kcp, cluster, tmpl *unstructured.Unstructured, first bool, why string) error {
	bootstrap, _ := normalize(object(kcp.Object, "spec", "kubeadmConfigSpec")).(map[string]any)
	if bootstrap == nil {
		bootstrap = map[string]any{}
	}
	if first {
		delete(bootstrap, "joinConfiguration")
		if bootstrap["initConfiguration"] == nil {
			bootstrap["initConfiguration"] = map[string]any{}
		}
	} else {
		delete(bootstrap, "initConfiguration")
		delete(bootstrap, "clusterConfiguration")
		if bootstrap["joinConfiguration"] == nil {
			bootstrap["joinConfiguration"] = map[string]any{}
		}
		if !has(bootstrap, "joinConfiguration", "controlPlane") {
			set(bootstrap, map[string]any{}, "joinConfiguration", "controlPlane")
		}
	}
	spec := map[string]any{}
	for _, f := range []string{"deletion", "taints", "minReadySeconds"} {
		if v, ok := object(kcp.Object, "spec", "machineTemplate", "spec")[f]; ok {
			spec[f] = v
		}
	}
	labels := map[string]string{controlPlaneLabel: "", controlPlaneNameLabel: kcp.GetName()}
	for k, v := range object(kcp.Object, "spec", "machineTemplate", "metadata", "labels") {
		if s, ok := v.(string); ok {
			labels[k] = s
		}
	}
	name := p.freeChildName(kcp, kindMachine, kindMetal3Machine, kindKubeadmConfig)
	return p.createMachine(newMachine{
		controller: controllerKCP, owner: kcp, name: name, cluster: cluster.GetName(), labels: labels,
		version: str(kcp.Object, "spec", "version"), spec: spec, bootstrap: bootstrap, infraTemplate: tmpl, why: why,
	})
}

func (p *pass) controlPlaneStatus(kcp, cluster *unstructured.Unstructured) error {
	if kcp == nil {
		return nil
	}
	next := kcp.DeepCopy()
	set(next.Object, kcp.GetGeneration(), "status", "observedGeneration")
	machines := p.w.owned(kindMachine, kcp)
	counts := p.countMachines(machines)
	counts.write(next)
	if cluster != nil {
		set(next.Object, fmt.Sprintf("%s=%s,%s", clusterNameLabel, cluster.GetName(), controlPlaneLabel), "status", "selector")
	}
	versions := machineVersions(machines)
	if len(versions) > 0 {
		set(next.Object, versions, "status", "versions")
		set(next.Object, versions[0].(map[string]any)["version"], "status", "version")
	} else {
		unset(next.Object, "status", "versions")
	}
	initialized := flag(kcp.Object, "status", "initialization", "controlPlaneInitialized") ||
		slices.ContainsFunc(machines, func(m *unstructured.Unstructured) bool { return has(m.Object, "status", "nodeRef") })
	if initialized {
		set(next.Object, true, "status", "initialization", "controlPlaneInitialized")
	}
	desired := desiredReplicas(kcp)
	withNode := int64(0)
	for _, m := range machines {
		if has(m.Object, "status", "nodeRef") {
			withNode++
		}
	}
	// etcd keeps quorum while a majority of the members is healthy.
	available := initialized && counts.ready >= 1 && counts.ready > withNode/2
	setConditions(next, p.now,
		conditionIf(initialized, "Initialized", "Initialized", "NotInitialized", "waiting for the first control-plane machine to serve the API"),
		conditionIf(available, "Available", "Available", "NotAvailable", "no healthy control-plane machine with etcd quorum yet"),
		condition{typ: "CertificatesAvailable", status: "True", reason: "Available"},
		conditionIf(initialized && counts.ready == withNode, "EtcdClusterHealthy", "Healthy", "NotHealthy", "waiting for etcd members"),
		conditionIf(initialized && counts.ready == withNode, "ControlPlaneComponentsHealthy", "Healthy", "NotHealthy", "waiting for control-plane components"),
		conditionIf(counts.ready == counts.replicas, "MachinesReady", "Ready", "NotReady", notReadyMachines(machines)),
		conditionIf(counts.upToDate == counts.replicas, "MachinesUpToDate", "UpToDate", "NotUpToDate", "some machines are not up to date"),
		conditionIf(counts.upToDate < counts.replicas, "RollingOut", "RollingOut", "NotRollingOut", ""),
		conditionIf(counts.replicas < desired, "ScalingUp", "ScalingUp", "NotScalingUp", ""),
		conditionIf(counts.replicas > desired, "ScalingDown", "ScalingDown", "NotScalingDown", ""),
		condition{typ: "Remediating", status: "False", reason: "NotRemediating"},
		condition{typ: "Deleting", status: "False", reason: "NotDeleting"},
		notPaused,
	)
	wrote, err := p.updateStatus(controllerKCP, kcp, next)
	if err != nil || !wrote {
		return err
	}
	if initialized && !flag(kcp.Object, "status", "initialization", "controlPlaneInitialized") {
		p.emit(controllerKCP, next, "control plane initialized")
	}
	if available != conditionTrue(kcp, "Available") {
		p.emit(controllerKCP, next, "Available=%s", isTrue(available))
	}
	if counts.ready == desired && counts.upToDate == desired && counts.replicas == desired &&
		(counts.ready != valueOr(kcp, "readyReplicas") || counts.upToDate != valueOr(kcp, "upToDateReplicas") || counts.replicas != valueOr(kcp, "replicas")) {
		p.emit(controllerKCP, next, "%d of %d machines ready at %s", counts.ready, desired, str(kcp.Object, "spec", "version"))
	}
	return nil
}

// valueOr returns status.<field> of obj, or -1 if it has none.
func valueOr(obj *unstructured.Unstructured, field string) int64 {
	if n, ok := integer(obj.Object, "status", field); ok {
		return n
	}
	return -1
}
