package sim

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// templateHash identifies a MachineDeployment's machine template: a new
// template (version, infrastructure or bootstrap reference) gets a new
// MachineSet, as Cluster API rolls out.
func templateHash(md *unstructured.Unstructured) string {
	data := fmt.Sprint(normalize(object(md.Object, "spec", "template")))
	sum := sha256.Sum256([]byte(data))
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"
	out := make([]byte, 10)
	for i := range out {
		out[i] = alphabet[int(sum[i])%len(alphabet)]
	}
	return string(out)
}

// reconcileMachineDeployments plays the MachineDeployment controller: one
// MachineSet per machine template, the current one scaled up and the
// older ones down within maxSurge and maxUnavailable (defaults 1 and 0).
func (p *pass) reconcileMachineDeployments() error {
	var errs []error
	for _, md := range p.w.list(kindMachineDeployment) {
		if md.GetDeletionTimestamp() != nil {
			continue
		}
		cluster := p.w.get(kindCluster, str(md.Object, "spec", "clusterName"))
		if cluster == nil || clusterPaused(cluster) || flag(md.Object, "spec", "paused") {
			continue
		}
		if err := p.rollOut(md, cluster); err != nil {
			errs = append(errs, err)
		}
		if err := p.deploymentStatus(p.w.get(kindMachineDeployment, md.GetName())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rollOut creates the current MachineSet and moves replicas from the old
// ones to it.
func (p *pass) rollOut(md, cluster *unstructured.Unstructured) error {
	hash := templateHash(md)
	desired := desiredReplicas(md)
	var current *unstructured.Unstructured
	var old []*unstructured.Unstructured
	for _, ms := range p.w.owned(kindMachineSet, md) {
		if ms.GetLabels()[templateHashLabel] == hash {
			current = ms
		} else {
			old = append(old, ms)
		}
	}
	if current == nil {
		replicas := desired
		if len(old) > 0 {
			replicas = 0
		}
		return p.createMachineSet(md, cluster, hash, replicas)
	}
	surge, unavailable := rolloutLimits(md, desired)
	var total, available int64
	for _, ms := range append([]*unstructured.Unstructured{current}, old...) {
		n, _ := integer(ms.Object, "spec", "replicas")
		total += n
		available += p.countMachines(p.w.owned(kindMachine, ms)).available
	}
	cur, _ := integer(current.Object, "spec", "replicas")
	want := cur
	switch {
	case len(old) == 0:
		want = desired
	case cur < desired && total < desired+surge:
		want = min(desired, cur+desired+surge-total)
	}
	if want != cur {
		return p.scaleMachineSet(current, want)
	}
	// Scale the old sets down as far as availability allows.
	spare := available - (desired - unavailable)
	for _, ms := range old {
		n, _ := integer(ms.Object, "spec", "replicas")
		if n == 0 {
			if len(p.w.owned(kindMachine, ms)) == 0 {
				if err := p.remove(ms); err != nil {
					return err
				}
				p.emit(controllerCAPI, ms, "deleted (rollout of MachineDeployment %s done)", md.GetName())
			}
			continue
		}
		if spare <= 0 {
			break
		}
		down := min(n, spare)
		return p.scaleMachineSet(ms, n-down)
	}
	return nil
}

// rolloutLimits are maxSurge and maxUnavailable of the deployment, as
// numbers of machines; both zero would stall, so maxUnavailable is then 1.
func rolloutLimits(md *unstructured.Unstructured, desired int64) (surge, unavailable int64) {
	surge, unavailable = 1, 0
	ru := object(md.Object, "spec", "rollout", "strategy", "rollingUpdate")
	if v, ok := ru["maxSurge"]; ok {
		if n, err := intstr.GetScaledValueFromIntOrPercent(intOrString(v), int(desired), true); err == nil {
			surge = int64(n)
		}
	}
	if v, ok := ru["maxUnavailable"]; ok {
		if n, err := intstr.GetScaledValueFromIntOrPercent(intOrString(v), int(desired), false); err == nil {
			unavailable = int64(n)
		}
	}
	if surge == 0 && unavailable == 0 {
		unavailable = 1
	}
	return surge, unavailable
}

func (p *pass) createMachineSet(md, cluster *unstructured.Unstructured, hash string, replicas int64) error {
	name := md.GetName() + "-" + hash[:5]
	selector := map[string]any{deploymentNameLabel: md.GetName(), templateHashLabel: hash, clusterNameLabel: cluster.GetName()}
	ms := newObject(kindMachineSet, md.GetNamespace(), name)
	ms.SetLabels(map[string]string{clusterNameLabel: cluster.GetName(), deploymentNameLabel: md.GetName(), templateHashLabel: hash})
	ms.SetOwnerReferences([]metav1.OwnerReference{ownerRef(md, true)})
	tmpl, _ := normalize(object(md.Object, "spec", "template")).(map[string]any)
	for k, v := range selector {
		set(tmpl, v, "metadata", "labels", k)
	}
	set(tmpl, cluster.GetName(), "spec", "clusterName")
	ms.Object["spec"] = map[string]any{
		"clusterName": cluster.GetName(),
		"replicas":    replicas,
		"selector":    map[string]any{"matchLabels": selector},
		"template":    tmpl,
	}
	if err := p.create(controllerCAPI, ms); err != nil {
		return err
	}
	p.emit(controllerCAPI, ms, "created by MachineDeployment %s with %d replicas", md.GetName(), replicas)
	return nil
}

func (p *pass) scaleMachineSet(ms *unstructured.Unstructured, replicas int64) error {
	next := ms.DeepCopy()
	set(next.Object, replicas, "spec", "replicas")
	if _, err := p.update(controllerCAPI, ms, next); err != nil {
		return err
	}
	from, _ := integer(ms.Object, "spec", "replicas")
	p.emit(controllerCAPI, ms, "scaled from %d to %d replicas", from, replicas)
	return nil
}

// reconcileMachineSets plays the MachineSet controller: it creates the
// missing machines all at once, once the control plane is stable (the
// MachineSet preflight check Cluster API runs by default), and deletes the
// surplus, unready machines first.
func (p *pass) reconcileMachineSets() error {
	var errs []error
	for _, ms := range p.w.list(kindMachineSet) {
		if ms.GetDeletionTimestamp() != nil {
			continue
		}
		cluster := p.clusterOf(ms)
		if cluster == nil || clusterPaused(cluster) {
			continue
		}
		if err := p.scaleMachines(ms, cluster); err != nil {
			errs = append(errs, err)
		}
		if err := p.machineSetStatus(p.w.get(kindMachineSet, ms.GetName())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (p *pass) scaleMachines(ms, cluster *unstructured.Unstructured) error {
	machines := p.w.owned(kindMachine, ms)
	desired, _ := integer(ms.Object, "spec", "replicas")
	n := int64(len(machines))
	if n > desired {
		// Unready machines go first, then the oldest.
		var victims []*unstructured.Unstructured
		for _, m := range machines {
			if !conditionTrue(m, "Ready") {
				victims = append(victims, m)
			}
		}
		for _, m := range machines {
			if conditionTrue(m, "Ready") {
				victims = append(victims, m)
			}
		}
		var errs []error
		for _, m := range victims[:n-desired] {
			errs = append(errs, p.deleteMachine(controllerCAPI, m, fmt.Sprintf("MachineSet %s scaled to %d", ms.GetName(), desired)))
		}
		return errors.Join(errs...)
	}
	if n == desired {
		return nil
	}
	if why := p.controlPlaneUnstable(cluster); why != "" {
		p.note(controllerCAPI, ms, "preflight:"+why, "waiting to create machines: %s", why)
		return nil
	}
	tmpl := object(ms.Object, "spec", "template")
	infra := p.w.get(kindMetal3MachineTemplate, str(tmpl, "spec", "infrastructureRef", "name"))
	bootstrapTmpl := p.w.get(kindKubeadmConfigTemplate, str(tmpl, "spec", "bootstrap", "configRef", "name"))
	if infra == nil || bootstrapTmpl == nil {
		return nil
	}
	labels := map[string]string{setNameLabel: ms.GetName()}
	for k, v := range object(tmpl, "metadata", "labels") {
		if s, ok := v.(string); ok {
			labels[k] = s
		}
	}
	spec := map[string]any{}
	for k, v := range object(tmpl, "spec") {
		switch k {
		case "bootstrap", "infrastructureRef", "readinessGates", "providerID", "version", "clusterName":
		default:
			spec[k] = v
		}
	}
	var errs []error
	for ; n < desired; n++ {
		name := p.freeChildName(ms, kindMachine, kindMetal3Machine, kindKubeadmConfig)
		errs = append(errs, p.createMachine(newMachine{
			controller: controllerCAPI, owner: ms, name: name, cluster: cluster.GetName(), labels: labels,
			version: str(tmpl, "spec", "version"), spec: spec,
			bootstrap:     object(bootstrapTmpl.DeepCopy().Object, "spec", "template", "spec"),
			infraTemplate: infra,
		}))
	}
	return errors.Join(errs...)
}

// controlPlaneUnstable says why a MachineSet may not create machines yet:
// the control plane has no machine yet or is upgrading (Cluster API's
// ControlPlaneIsStable preflight check). Empty means it may.
func (p *pass) controlPlaneUnstable(cluster *unstructured.Unstructured) string {
	kcp := p.controlPlaneOf(cluster)
	if kcp == nil {
		return ""
	}
	versions, _, _ := unstructured.NestedSlice(kcp.Object, "status", "versions")
	if len(versions) == 0 {
		return "KubeadmControlPlane " + kcp.GetName() + " is provisioning"
	}
	want := str(kcp.Object, "spec", "version")
	for _, v := range versions {
		if str(v.(map[string]any), "version") != want {
			return "KubeadmControlPlane " + kcp.GetName() + " is upgrading"
		}
	}
	return ""
}

func (p *pass) machineSetStatus(ms *unstructured.Unstructured) error {
	if ms == nil {
		return nil
	}
	next := ms.DeepCopy()
	set(next.Object, ms.GetGeneration(), "status", "observedGeneration")
	machines := p.w.owned(kindMachine, ms)
	counts := p.countMachines(machines)
	counts.write(next)
	if sel := selectorString(object(ms.Object, "spec", "selector", "matchLabels")); sel != "" {
		set(next.Object, sel, "status", "selector")
	}
	if vs := machineVersions(machines); len(vs) > 0 {
		set(next.Object, vs, "status", "versions")
	} else {
		unset(next.Object, "status", "versions")
	}
	desired, _ := integer(ms.Object, "spec", "replicas")
	setConditions(next, p.now, replicaConditions(counts, desired, machines)...)
	_, err := p.updateStatus(controllerCAPI, ms, next)
	return err
}

func (p *pass) deploymentStatus(md *unstructured.Unstructured) error {
	if md == nil {
		return nil
	}
	next := md.DeepCopy()
	set(next.Object, md.GetGeneration(), "status", "observedGeneration")
	var machines []*unstructured.Unstructured
	sets := p.w.owned(kindMachineSet, md)
	for _, ms := range sets {
		machines = append(machines, p.w.owned(kindMachine, ms)...)
	}
	counts := p.countMachines(machines)
	counts.write(next)
	if sel := selectorString(object(md.Object, "spec", "selector", "matchLabels")); sel != "" {
		set(next.Object, sel, "status", "selector")
	}
	if vs := machineVersions(machines); len(vs) > 0 {
		set(next.Object, vs, "status", "versions")
	} else {
		unset(next.Object, "status", "versions")
	}
	desired := desiredReplicas(md)
	_, unavailable := rolloutLimits(md, desired)
	available := counts.available >= desired-unavailable
	phase := "Running"
	switch {
	case counts.replicas < desired:
		phase = "ScalingUp"
	case counts.replicas > desired:
		phase = "ScalingDown"
	}
	set(next.Object, phase, "status", "phase")
	conds := append(replicaConditions(counts, desired, machines),
		conditionIf(available, "Available", "Available", "NotAvailable",
			fmt.Sprintf("%d available replicas, at least %d required", counts.available, desired-unavailable)),
		conditionIf(len(sets) > 1, "RollingOut", "RollingOut", "NotRollingOut", ""))
	setConditions(next, p.now, conds...)
	wrote, err := p.updateStatus(controllerCAPI, md, next)
	if err != nil || !wrote {
		return err
	}
	if available != conditionTrue(md, "Available") {
		p.emit(controllerCAPI, next, "Available=%s (%d of %d machines available)", isTrue(available), counts.available, desired)
	}
	return nil
}

// replicaConditions are the conditions a MachineSet or MachineDeployment
// derives from its machines.
func replicaConditions(c machineCounts, desired int64, machines []*unstructured.Unstructured) []condition {
	return []condition{
		conditionIf(c.ready == c.replicas, "MachinesReady", "Ready", "NotReady", notReadyMachines(machines)),
		conditionIf(c.upToDate == c.replicas, "MachinesUpToDate", "UpToDate", "NotUpToDate", "some machines are not up to date"),
		conditionIf(c.replicas < desired, "ScalingUp", "ScalingUp", "NotScalingUp", ""),
		conditionIf(c.replicas > desired, "ScalingDown", "ScalingDown", "NotScalingDown", ""),
		{typ: "Remediating", status: "False", reason: "NotRemediating"},
		{typ: "Deleting", status: "False", reason: "NotDeleting"},
		notPaused,
	}
}

// selectorString renders matchLabels as a label selector string.
func selectorString(matchLabels map[string]any) string {
	var parts []string
	for k, v := range matchLabels {
		parts = append(parts, fmt.Sprintf("%s=%v", k, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
