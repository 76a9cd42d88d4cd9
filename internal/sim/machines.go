package sim

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// newMachine is what a control plane or a MachineSet asks for when it
// creates a Machine with its KubeadmConfig and Metal3Machine.
type newMachine struct {
	controller    string // the simulated controller that creates it
	owner         *unstructured.Unstructured
	name          string
	cluster       string
	labels        map[string]string
	version       string
	spec          map[string]any // further Machine spec fields from the owner's template
	bootstrap     map[string]any // the KubeadmConfig's spec
	infraTemplate *unstructured.Unstructured
	why           string // for the event: "first", "2 of 3", "rollout"
}

// createMachine creates a Machine owned by its control plane or
// MachineSet, then its KubeadmConfig and its Metal3Machine (cloned from the
// Metal3MachineTemplate), both owned by the Machine. Names are shared, as
// the kubeadm control plane names them.
func (p *pass) createMachine(nm newMachine) error {
	labels := map[string]string{clusterNameLabel: nm.cluster}
	for k, v := range nm.labels {
		labels[k] = v
	}
	m := newObject(kindMachine, p.ns, nm.name)
	m.SetLabels(labels)
	m.SetOwnerReferences([]metav1.OwnerReference{ownerRef(nm.owner, true)})
	spec := map[string]any{}
	for k, v := range nm.spec {
		spec[k] = v
	}
	spec["clusterName"] = nm.cluster
	spec["bootstrap"] = map[string]any{"configRef": map[string]any{"apiGroup": groupBootstrap, "kind": kindKubeadmConfig.Kind, "name": nm.name}}
	spec["infrastructureRef"] = map[string]any{"apiGroup": groupInfra, "kind": kindMetal3Machine.Kind, "name": nm.name}
	if nm.version != "" {
		spec["version"] = nm.version
	}
	m.Object["spec"] = spec
	if err := p.create(nm.controller, m); err != nil {
		return err
	}

	kc := newObject(kindKubeadmConfig, p.ns, nm.name)
	kc.SetLabels(labels)
	kc.SetOwnerReferences([]metav1.OwnerReference{ownerRef(m, true)})
	kc.Object["spec"] = nm.bootstrap
	if kc.Object["spec"] == nil {
		kc.Object["spec"] = map[string]any{}
	}
	if err := p.create(nm.controller, kc); err != nil {
		return err
	}

	m3m := newObject(kindMetal3Machine, p.ns, nm.name)
	m3m.SetLabels(labels)
	m3m.SetAnnotations(map[string]string{
		clonedFromAnnotation: nm.infraTemplate.GetName(),
		clonedKindAnnotation: kindMetal3MachineTemplate.Kind + "." + groupInfra,
	})
	m3m.SetOwnerReferences([]metav1.OwnerReference{ownerRef(m, true)})
	m3m.Object["spec"] = object(nm.infraTemplate.DeepCopy().Object, "spec", "template", "spec")
	if m3m.Object["spec"] == nil {
		m3m.Object["spec"] = map[string]any{}
	}
	if err := p.create(nm.controller, m3m); err != nil {
		return err
	}
	why := ""
	if nm.why != "" {
		why = " (" + nm.why + ")"
	}
	p.emit(nm.controller, m, "created by %s %s at version %s%s", nm.owner.GetKind(), nm.owner.GetName(), nm.version, why)
	return nil
}

// deleteMachine deletes a Machine and what was created for it, giving its
// host back first: without finalizers, nothing else would. why says why,
// for the event.
func (p *pass) deleteMachine(controller string, m *unstructured.Unstructured, why string) error {
	if m3m := p.infraMachineOf(m); m3m != nil && hasOwner(m3m, m) {
		if err := p.deleteMetal3Machine(m3m); err != nil {
			return err
		}
	}
	if kc := p.bootstrapOf(m); kc != nil && hasOwner(kc, m) {
		if err := p.deleteBootstrapConfig(kc); err != nil {
			return err
		}
	}
	if err := p.remove(m); err != nil {
		return err
	}
	p.emit(controller, m, "deleted (%s)", why)
	return nil
}

// deleteMetal3Machine releases the machine's host, deletes its data claim,
// data and rendered Secrets, then the Metal3Machine.
func (p *pass) deleteMetal3Machine(m3m *unstructured.Unstructured) error {
	if host := p.hostOf(m3m); host != nil {
		if err := p.applyHost(host, nil, nil); err != nil {
			return err
		}
		p.emit(controllerCAPM3, host, "released by Metal3Machine %s", m3m.GetName())
	}
	if claim := p.w.get(kindMetal3DataClaim, m3m.GetName()); claim != nil && hasOwner(claim, m3m) {
		if err := p.deleteDataClaim(claim); err != nil {
			return err
		}
	}
	return p.remove(m3m)
}

// deleteDataClaim deletes a claim, the Metal3Data rendered for it and the
// data's Secrets, and frees the index.
func (p *pass) deleteDataClaim(claim *unstructured.Unstructured) error {
	var errs []error
	for _, d := range p.w.list(kindMetal3Data) {
		if str(d.Object, "spec", "claim", "name") != claim.GetName() {
			continue
		}
		for _, f := range []string{"metaData", "networkData"} {
			if name := str(d.Object, "spec", f, "name"); name != "" {
				errs = append(errs, p.deleteSecret(name))
			}
		}
		errs = append(errs, p.releaseAddresses(d), p.remove(d))
		if tmpl := p.w.get(kindMetal3DataTemplate, str(d.Object, "spec", "template", "name")); tmpl != nil {
			errs = append(errs, p.recordIndexes(tmpl))
		}
	}
	errs = append(errs, p.remove(claim))
	return errors.Join(errs...)
}

func (p *pass) deleteBootstrapConfig(kc *unstructured.Unstructured) error {
	if name := str(kc.Object, "status", "dataSecretName"); name != "" {
		if err := p.deleteSecret(name); err != nil {
			return err
		}
	}
	return p.remove(kc)
}

// reconcileMachines plays the Machine controller: it copies the bootstrap
// data Secret and the providerID onto the Machine, matches the node, and
// reports the machine's phase and conditions.
func (p *pass) reconcileMachines() error {
	var errs []error
	for _, m := range p.w.list(kindMachine) {
		if m.GetDeletionTimestamp() != nil {
			continue
		}
		cluster := p.clusterOf(m)
		if cluster == nil || clusterPaused(cluster) {
			continue
		}
		if err := p.adoptMachineParts(m); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := p.machineSpec(p.w.get(kindMachine, m.GetName())); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := p.machineStatus(p.w.get(kindMachine, m.GetName())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// bootstrapOf returns the KubeadmConfig a Machine's bootstrap.configRef
// names; other bootstrap providers are not simulated.
func (p *pass) bootstrapOf(m *unstructured.Unstructured) *unstructured.Unstructured {
	if str(m.Object, "spec", "bootstrap", "configRef", "kind") != kindKubeadmConfig.Kind {
		return nil
	}
	return p.w.get(kindKubeadmConfig, str(m.Object, "spec", "bootstrap", "configRef", "name"))
}

// infraMachineOf returns the Metal3Machine a Machine's infrastructureRef
// names.
func (p *pass) infraMachineOf(m *unstructured.Unstructured) *unstructured.Unstructured {
	if str(m.Object, "spec", "infrastructureRef", "kind") != kindMetal3Machine.Kind {
		return nil
	}
	return p.w.get(kindMetal3Machine, str(m.Object, "spec", "infrastructureRef", "name"))
}

// adoptMachineParts makes the Machine the owner of its KubeadmConfig and
// Metal3Machine, as Cluster API does for a Machine a user wrote; those the
// simulator creates are owned from the start.
func (p *pass) adoptMachineParts(m *unstructured.Unstructured) error {
	parts := []*unstructured.Unstructured{
		p.bootstrapOf(m),
		p.infraMachineOf(m),
	}
	for _, part := range parts {
		if part == nil || hasOwner(part, m) || controllerRef(part) != nil {
			continue
		}
		a := newObject(part.GroupVersionKind(), part.GetNamespace(), part.GetName())
		a.SetOwnerReferences([]metav1.OwnerReference{ownerRef(m, true)})
		if err := p.apply(controllerCAPI, a); err != nil {
			return err
		}
		p.emit(controllerCAPI, part, "owned by Machine %s", m.GetName())
	}
	return nil
}

// machineSpec copies the bootstrap data Secret name and the providerID,
// the two spec fields Cluster API fills in, with server-side apply. Every
// apply carries both, or it would take back the one left out.
func (p *pass) machineSpec(m *unstructured.Unstructured) error {
	secret := str(m.Object, "spec", "bootstrap", "dataSecretName")
	if kc := p.bootstrapOf(m); kc != nil &&
		secret == "" && flag(kc.Object, "status", "initialization", "dataSecretCreated") {
		secret = str(kc.Object, "status", "dataSecretName")
	}
	id := str(m.Object, "spec", "providerID")
	if m3m := p.infraMachineOf(m); m3m != nil &&
		id == "" && flag(m3m.Object, "status", "initialization", "provisioned") {
		id = str(m3m.Object, "spec", "providerID")
	}
	newSecret := secret != str(m.Object, "spec", "bootstrap", "dataSecretName")
	newID := id != str(m.Object, "spec", "providerID")
	if !newSecret && !newID {
		return nil
	}
	a := newObject(kindMachine, m.GetNamespace(), m.GetName())
	if secret != "" {
		set(a.Object, secret, "spec", "bootstrap", "dataSecretName")
	}
	if id != "" {
		set(a.Object, id, "spec", "providerID")
	}
	if err := p.apply(controllerCAPI, a); err != nil {
		return err
	}
	if newSecret {
		p.emit(controllerCAPI, m, "bootstrap data Secret %s ready", secret)
	}
	if newID {
		p.emit(controllerCAPI, m, "infrastructure ready, providerID %s", id)
	}
	return nil
}

func (p *pass) machineStatus(m *unstructured.Unstructured) error {
	next := m.DeepCopy()
	set(next.Object, m.GetGeneration(), "status", "observedGeneration")
	bootstrapReady := str(m.Object, "spec", "bootstrap", "dataSecretName") != ""
	m3m := p.infraMachineOf(m)
	infraReady := m3m != nil && flag(m3m.Object, "status", "initialization", "provisioned")
	providerID := str(m.Object, "spec", "providerID")
	if bootstrapReady {
		set(next.Object, true, "status", "initialization", "bootstrapDataSecretCreated")
	}
	if infraReady {
		set(next.Object, true, "status", "initialization", "infrastructureProvisioned")
		if addrs, _, _ := unstructured.NestedSlice(m3m.Object, "status", "addresses"); len(addrs) > 0 {
			set(next.Object, addrs, "status", "addresses")
		}
	}
	// The node joins with the providerID CAPM3 found; Cluster API finds it
	// in the workload cluster a moment later.
	hadNode := has(m.Object, "status", "nodeRef")
	node := hadNode || infraReady && providerID != "" && p.waited(m, "node", p.s.delays.Default)
	if node {
		set(next.Object, map[string]any{"name": m.GetName()}, "status", "nodeRef")
		set(next.Object, nodeInfo(m), "status", "nodeInfo")
	}
	phase := "Pending"
	switch {
	case node:
		phase = "Running"
	case infraReady:
		phase = "Provisioned"
	case bootstrapReady:
		phase = "Provisioning"
	}
	set(next.Object, phase, "status", "phase")
	ready := bootstrapReady && infraReady && node
	upToDate := p.machineUpToDate(m)
	setConditions(next, p.now,
		conditionIf(bootstrapReady, "BootstrapConfigReady", "Ready", "NotReady", "KubeadmConfig has not rendered the bootstrap data yet"),
		conditionIf(infraReady, "InfrastructureReady", "Ready", "NotReady", p.infraWaitMessage(m3m)),
		conditionIf(node, "NodeReady", "NodeReady", "NodeDoesNotExist", "waiting for a Node with providerID "+providerID),
		conditionIf(node, "NodeHealthy", "NodeHealthy", "NodeDoesNotExist", "waiting for a Node with providerID "+providerID),
		conditionIf(ready, "Ready", "Ready", "NotReady", machineWaitMessage(bootstrapReady, infraReady, p.infraWaitMessage(m3m), providerID)),
		conditionIf(ready, "Available", "Available", "NotAvailable", "the machine is not ready"),
		conditionIf(upToDate, "UpToDate", "UpToDate", "NotUpToDate", "the owner's spec changed; the machine will be replaced"),
		condition{typ: "Deleting", status: "False", reason: "NotDeleting"},
		notPaused,
	)
	wrote, err := p.updateStatus(controllerCAPI, m, next)
	if err != nil {
		return err
	}
	if wrote && phase != str(m.Object, "status", "phase") {
		p.forget(m, "node")
		if node && !hadNode {
			p.emit(controllerCAPI, next, "node %s matched by providerID %s, Running", m.GetName(), providerID)
		}
	}
	return nil
}

// nodeInfo is what the kubelet of the machine's node reports.
func nodeInfo(m *unstructured.Unstructured) map[string]any {
	sum := sha256.Sum256([]byte("node/" + m.GetUID()))
	version := str(m.Object, "spec", "version")
	return map[string]any{
		"architecture":            "amd64",
		"bootID":                  fmt.Sprintf("%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16]),
		"containerRuntimeVersion": "containerd://2.1.0",
		"kernelVersion":           "6.8.0-60-generic",
		"kubeProxyVersion":        version,
		"kubeletVersion":          version,
		"machineID":               fmt.Sprintf("%x", sum[16:32]),
		"operatingSystem":         "linux",
		"osImage":                 "Ubuntu 24.04.2 LTS",
		"systemUUID":              fmt.Sprintf("%x-%x-%x-%x-%x", sum[16:20], sum[20:22], sum[22:24], sum[24:26], sum[26:32]),
	}
}

// machineUpToDate reports whether the machine matches its owner's current
// spec: the control plane's version and machine template, or the
// MachineDeployment's current template.
func (p *pass) machineUpToDate(m *unstructured.Unstructured) bool {
	ref := controllerRef(m)
	if ref == nil {
		return true
	}
	switch ref.Kind {
	case kindKubeadmControlPlane.Kind:
		kcp := p.w.byUID(kindKubeadmControlPlane, ref.UID)
		if kcp == nil {
			return true
		}
		return str(m.Object, "spec", "version") == str(kcp.Object, "spec", "version") &&
			p.clonedFrom(m) == str(kcp.Object, "spec", "machineTemplate", "spec", "infrastructureRef", "name")
	case kindMachineSet.Kind:
		ms := p.w.byUID(kindMachineSet, ref.UID)
		if ms == nil {
			return true
		}
		mdRef := controllerRef(ms)
		if mdRef == nil {
			return true
		}
		md := p.w.byUID(kindMachineDeployment, mdRef.UID)
		return md == nil || ms.GetLabels()[templateHashLabel] == templateHash(md)
	}
	return true
}

// clonedFrom returns the name of the Metal3MachineTemplate the machine's
// Metal3Machine was cloned from.
func (p *pass) clonedFrom(m *unstructured.Unstructured) string {
	if m3m := p.infraMachineOf(m); m3m != nil {
		return m3m.GetAnnotations()[clonedFromAnnotation]
	}
	return ""
}

// machineVersions is status.versions of a control plane or deployment, as
// Cluster API computes it: the kubelet's version where the node reports
// one, else spec.version, counted in machine creation order.
func machineVersions(machines []*unstructured.Unstructured) []any {
	counts := map[string]int64{}
	var order []string
	sorted := slices.Clone(machines)
	slices.SortFunc(sorted, compareAge)
	for _, m := range sorted {
		v := str(m.Object, "status", "nodeInfo", "kubeletVersion")
		if v == "" {
			v = str(m.Object, "spec", "version")
		}
		if v == "" {
			continue
		}
		if _, seen := counts[v]; !seen {
			order = append(order, v)
		}
		counts[v]++
	}
	out := make([]any, 0, len(order))
	for _, v := range order {
		out = append(out, versionEntry(v, counts[v]))
	}
	return out
}

// machineCounts are the replica counters of a set of machines.
type machineCounts struct {
	replicas, ready, available, upToDate int64
}

func (p *pass) countMachines(machines []*unstructured.Unstructured) machineCounts {
	var c machineCounts
	for _, m := range machines {
		c.replicas++
		if conditionTrue(m, "Ready") {
			c.ready++
		}
		if conditionTrue(m, "Available") {
			c.available++
		}
		if p.machineUpToDate(m) {
			c.upToDate++
		}
	}
	return c
}

func (c machineCounts) write(obj *unstructured.Unstructured) {
	set(obj.Object, c.replicas, "status", "replicas")
	set(obj.Object, c.ready, "status", "readyReplicas")
	set(obj.Object, c.available, "status", "availableReplicas")
	set(obj.Object, c.upToDate, "status", "upToDateReplicas")
}

// infraWaitMessage says what a machine's infrastructure waits for, naming
// the BareMetalHost as CAPM3's conditions do, so that a stage held up by
// one host says which.
func (p *pass) infraWaitMessage(m3m *unstructured.Unstructured) string {
	if m3m == nil {
		return "Metal3Machine does not exist yet"
	}
	host := p.hostOf(m3m)
	if host == nil {
		return fmt.Sprintf("Metal3Machine %s is waiting for an available BareMetalHost", m3m.GetName())
	}
	state := str(host.Object, "status", "provisioning", "state")
	if state == "" {
		state = "registering"
	}
	msg := fmt.Sprintf("BareMetalHost %s/%s is %s", host.GetNamespace(), host.GetName(), state)
	if e := str(host.Object, "status", "errorMessage"); e != "" {
		msg += ": " + e
	}
	return msg
}

// machineWaitMessage is the Ready condition's message of a machine that
// is not ready: the first thing it waits for.
func machineWaitMessage(bootstrapReady, infraReady bool, infra, providerID string) string {
	switch {
	case !bootstrapReady:
		return "waiting for the bootstrap data"
	case !infraReady:
		return infra
	default:
		return "waiting for a Node with providerID " + providerID
	}
}

// notReadyMachines aggregates the Ready messages of machines that are not
// ready, the way Cluster API's MachinesReady conditions do:
// "* Machine <name>: <message>", one line each, at most three.
func notReadyMachines(machines []*unstructured.Unstructured) string {
	var lines []string
	more := 0
	for _, m := range machines {
		if conditionTrue(m, "Ready") {
			continue
		}
		if len(lines) == 3 {
			more++
			continue
		}
		msg := conditionMessage(m, "Ready")
		if msg == "" {
			msg = "not ready"
		}
		lines = append(lines, fmt.Sprintf("* Machine %s: %s", m.GetName(), msg))
	}
	if more > 0 {
		lines = append(lines, fmt.Sprintf("* and %d more machines not ready", more))
	}
	if len(lines) == 0 {
		return "some machines are not ready"
	}
	return strings.Join(lines, "\n")
}
