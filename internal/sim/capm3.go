package sim

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// ProviderIDFormat is the form of the providerID CAPM3 gives a machine.
type ProviderIDFormat string

const (
	// ProviderIDHostUID is metal3://<BareMetalHost metadata.uid>: what seed
	// 002 describes, what a cloud provider sets from ds.meta_data.uuid, and
	// what CAPM3 keeps when a Node already carries it. The default.
	ProviderIDHostUID ProviderIDFormat = "HostUID"
	// ProviderIDNamespaced is metal3://<namespace>/<host>/<metal3machine>:
	// what CAPM3 v1.13 sets by default when it finds the Node by its
	// metal3.io/uuid label and the Node has no providerID yet.
	ProviderIDNamespaced ProviderIDFormat = "Namespaced"
)

func (f ProviderIDFormat) validate() error {
	switch f {
	case "", ProviderIDHostUID, ProviderIDNamespaced:
		return nil
	}
	return fmt.Errorf("unknown providerID format %q (known: %s, %s)", f, ProviderIDHostUID, ProviderIDNamespaced)
}

// ProviderID returns the providerID of the machine on host whose
// Metal3Machine is metal3Machine.
func (f ProviderIDFormat) ProviderID(host, metal3Machine *unstructured.Unstructured) string {
	if f == ProviderIDNamespaced {
		return fmt.Sprintf("metal3://%s/%s/%s", host.GetNamespace(), host.GetName(), metal3Machine.GetName())
	}
	return "metal3://" + string(host.GetUID())
}

// hostAnnotation on a Metal3Machine names its BareMetalHost, as CAPM3
// writes it: "namespace/name".
const hostAnnotation = "metal3.io/BareMetalHost"

// reconcileMetal3Clusters plays CAPM3's Metal3Cluster controller: once
// Cluster API has made the Cluster its owner and the control-plane
// endpoint is set, the infrastructure is provisioned.
func (p *pass) reconcileMetal3Clusters() error {
	var errs []error
	for _, m3c := range p.w.list(kindMetal3Cluster) {
		if m3c.GetDeletionTimestamp() != nil {
			continue
		}
		cluster := p.ownerCluster(m3c)
		if cluster != nil && clusterPaused(cluster) {
			continue
		}
		next := m3c.DeepCopy()
		host := str(m3c.Object, "spec", "controlPlaneEndpoint", "host")
		port, _ := integer(m3c.Object, "spec", "controlPlaneEndpoint", "port")
		was := flag(m3c.Object, "status", "initialization", "provisioned")
		var infra condition
		switch {
		case cluster == nil:
			infra = condition{typ: "BaremetalInfrastructureReady", status: "False", reason: "WaitingForClusterOwnerRef", message: "waiting for Cluster API to set the owner Cluster"}
		case host == "" || port == 0:
			infra = condition{typ: "BaremetalInfrastructureReady", status: "False", reason: "ControlPlaneEndpointFailed", message: "spec.controlPlaneEndpoint has no host or port"}
		case was || p.waited(m3c, "endpoint", p.s.delays.Default):
			infra = condition{typ: "BaremetalInfrastructureReady", status: "True", reason: "Ready"}
			set(next.Object, true, "status", "initialization", "provisioned")
		default:
			infra = condition{typ: "BaremetalInfrastructureReady", status: "False", reason: "NotReady", message: "checking the control-plane endpoint"}
		}
		ready := infra.status == "True"
		setConditions(next, p.now, infra, conditionIf(ready, "Ready", "Ready", "NotReady", infra.message), notPaused)
		wrote, err := p.updateStatus(controllerCAPM3, m3c, next)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if wrote && ready && !was {
			p.forget(m3c, "endpoint")
			p.emit(controllerCAPM3, next, "control-plane endpoint %s:%d accepted, infrastructure provisioned", host, port)
		}
	}
	return errors.Join(errs...)
}

// reconcileMetal3Machines plays CAPM3's Metal3Machine controller: it
// waits for the bootstrap data, picks an available host, renders the
// machine's data, gives the host its image and user data, and once the
// host is provisioned and the node has joined, sets the providerID.
func (p *pass) reconcileMetal3Machines() error {
	var errs []error
	for _, m3m := range p.w.list(kindMetal3Machine) {
		if m3m.GetDeletionTimestamp() != nil {
			continue
		}
		if err := p.reconcileMetal3Machine(m3m); err != nil {
			errs = append(errs, err)
		}
	}
	if err := p.releaseHosts(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (p *pass) reconcileMetal3Machine(m3m *unstructured.Unstructured) error {
	ref := controllerRef(m3m)
	if ref == nil || ref.Kind != "Machine" {
		return nil // CAPM3 waits for Cluster API to set the owner Machine
	}
	machine := p.w.byUID(kindMachine, ref.UID)
	cluster := p.clusterOf(machine)
	if machine == nil || cluster == nil || clusterPaused(cluster) {
		return nil
	}
	if err := p.actMetal3Machine(m3m, machine, cluster); err != nil {
		return err
	}
	m3m = p.w.get(kindMetal3Machine, m3m.GetName())
	if m3m == nil {
		return nil
	}
	return p.metal3MachineStatus(m3m, machine, cluster)
}

// actMetal3Machine takes the next step of the Metal3Machine's flow that is
// due: claim a host, claim the machine's data, give the host its image,
// set the providerID.
func (p *pass) actMetal3Machine(m3m, machine, cluster *unstructured.Unstructured) error {
	if !p.infraProvisioned(cluster) ||
		str(machine.Object, "spec", "bootstrap", "dataSecretName") == "" {
		return nil
	}
	host := p.hostOf(m3m)
	if host == nil {
		chosen, err := chooseHost(p.w.list(kindBareMetalHost), m3m)
		if err != nil || chosen == nil {
			return err // no host yet: the status says so
		}
		if err := p.applyHost(chosen, m3m, nil); err != nil {
			return err
		}
		p.emit(controllerCAPM3, chosen, "claimed by Metal3Machine %s", m3m.GetName())
		next := m3m.DeepCopy()
		ann := next.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann[hostAnnotation] = chosen.GetNamespace() + "/" + chosen.GetName()
		next.SetAnnotations(ann)
		_, err = p.update(controllerCAPM3, m3m, next)
		return err
	}
	data, ready := p.machineData(m3m)
	if !ready {
		return p.claimData(m3m)
	}
	if !wantsImage(host) {
		if err := p.applyHost(host, m3m, provisioningFields(m3m, machine, data)); err != nil {
			return err
		}
		p.emit(controllerCAPM3, host, "image %s and user data %s set for Metal3Machine %s",
			str(m3m.Object, "spec", "image", "url"), str(machine.Object, "spec", "bootstrap", "dataSecretName"), m3m.GetName())
		return nil
	}
	if str(host.Object, "status", "provisioning", "state") != hostProvisioned || str(m3m.Object, "spec", "providerID") != "" {
		return nil
	}
	if !p.waited(m3m, "boot", p.s.delays.MachineBoot) {
		return nil
	}
	next := m3m.DeepCopy()
	id := p.s.opts.ProviderIDs.ProviderID(host, m3m)
	set(next.Object, id, "spec", "providerID")
	if _, err := p.update(controllerCAPM3, m3m, next); err != nil {
		return err
	}
	p.forget(m3m, "boot")
	p.emit(controllerCAPM3, next, "node of host %s joined, providerID %s", host.GetName(), id)
	return nil
}

// metal3MachineStatus writes what CAPM3 reports of the machine's progress.
func (p *pass) metal3MachineStatus(m3m, machine, cluster *unstructured.Unstructured) error {
	next := m3m.DeepCopy()
	host := p.hostOf(m3m)
	secret := str(machine.Object, "spec", "bootstrap", "dataSecretName")
	if secret != "" {
		set(next.Object, map[string]any{"name": secret, "namespace": m3m.GetNamespace()}, "status", "userData")
	}
	associate := condition{typ: "AssociateBareMetalHost", status: "True", reason: "AssociateBareMetalHostSuccess"}
	switch {
	case !p.infraProvisioned(cluster):
		associate = condition{typ: "AssociateBareMetalHost", status: "False", reason: "WaitingforMetal3Cluster", message: "waiting for the Metal3Cluster"}
	case secret == "":
		associate = condition{typ: "AssociateBareMetalHost", status: "False", reason: "WaitingForBootstrapData", message: "Waiting for bootstrap data to be ready before proceeding"}
	case host == nil:
		associate = condition{typ: "AssociateBareMetalHost", status: "False", reason: "AssociateBareMetalHostFailed", message: "no available BareMetalHost matches the hostSelector"}
	}
	meta := condition{typ: "AssociateMetal3MachineMetaData", status: "True", reason: "AssociateMetal3MachineMetaDataSuccess"}
	dataReady := condition{typ: "Metal3DataReady", status: "True", reason: "Metal3DataSecretsReady"}
	if host == nil {
		meta = condition{typ: "AssociateMetal3MachineMetaData", status: "False", reason: "WaitingForBareMetalHost", message: "no host associated"}
	}
	if data, ready := p.machineData(m3m); data != nil && ready {
		for _, f := range []string{"metaData", "networkData"} {
			if ref := object(data.Object, "spec", f); ref != nil {
				set(next.Object, ref, "status", f)
			}
		}
		set(next.Object, map[string]any{"name": data.GetName(), "namespace": data.GetNamespace()}, "status", "renderedData")
	} else if !ready {
		dataReady = condition{typ: "Metal3DataReady", status: "False", reason: "WaitingForMetal3Data", message: "waiting for the Metal3Data secrets"}
	}
	provisioned := host != nil && str(m3m.Object, "spec", "providerID") != "" &&
		str(host.Object, "status", "provisioning", "state") == hostProvisioned
	if provisioned {
		set(next.Object, true, "status", "initialization", "provisioned")
		if addrs := hostAddresses(host); len(addrs) > 0 {
			set(next.Object, addrs, "status", "addresses")
		}
	}
	ready := associate.status == "True" && meta.status == "True" && dataReady.status == "True"
	msg := associate.message + meta.message + dataReady.message
	setConditions(next, p.now, associate, meta, dataReady, conditionIf(ready, "Ready", "Ready", "NotReady", msg), notPaused)
	wrote, err := p.updateStatus(controllerCAPM3, m3m, next)
	if wrote && provisioned && !flag(m3m.Object, "status", "initialization", "provisioned") {
		p.emit(controllerCAPM3, next, "provisioned on host %s", host.GetName())
	}
	return err
}

// hostOf returns the host associated with the Metal3Machine: the one its
// annotation names, or one whose consumer it already is (CAPM3 claims the
// host before it annotates the machine).
func (p *pass) hostOf(m3m *unstructured.Unstructured) *unstructured.Unstructured {
	if ann := m3m.GetAnnotations()[hostAnnotation]; ann != "" {
		ns, name, _ := strings.Cut(ann, "/")
		if h := p.w.get(kindBareMetalHost, name); h != nil && ns == m3m.GetNamespace() && consumerIs(h, m3m) {
			return h
		}
	}
	for _, h := range p.w.list(kindBareMetalHost) {
		if consumerIs(h, m3m) {
			return h
		}
	}
	return nil
}

func consumerIs(host, m3m *unstructured.Unstructured) bool {
	ref := object(host.Object, "spec", "consumerRef")
	return ref != nil && ref["kind"] == "Metal3Machine" && ref["name"] == m3m.GetName()
}

// chooseHost picks the host CAPM3 would give the Metal3Machine: one that
// is available, healthy, unclaimed, not paused and matches the machine's
// hostSelector. Among several it takes the first by name, where CAPM3
// takes any. It returns nil when none is free, and an error when the
// selector is invalid.
func chooseHost(hosts []*unstructured.Unstructured, m3m *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	sel, err := hostSelector(object(m3m.Object, "spec", "hostSelector"))
	if err != nil {
		return nil, fmt.Errorf("Metal3Machine %s/%s: spec.hostSelector: %w", m3m.GetNamespace(), m3m.GetName(), err)
	}
	var best *unstructured.Unstructured
	for _, h := range hosts {
		state := str(h.Object, "status", "provisioning", "state")
		_, paused := h.GetAnnotations()[hostPausedAnnotation]
		switch {
		case h.GetNamespace() != m3m.GetNamespace(), h.GetDeletionTimestamp() != nil, paused,
			state != hostAvailable && state != "ready",
			str(h.Object, "status", "operationalStatus") != "OK",
			object(h.Object, "spec", "consumerRef") != nil,
			!sel.Matches(labels.Set(h.GetLabels())):
			continue
		}
		if best == nil || h.GetName() < best.GetName() {
			best = h
		}
	}
	return best, nil
}

// hostSelector turns a Metal3Machine's hostSelector into a label
// selector. CAPM3's operators are those of k8s.io/apimachinery/pkg/selection
// ("in", "notin", "exists", "!", "=", "==", "!=", "gt", "lt").
func hostSelector(hs map[string]any) (labels.Selector, error) {
	sel := labels.NewSelector()
	for k, v := range object(hs, "matchLabels") {
		s, _ := v.(string)
		r, err := labels.NewRequirement(k, selection.Equals, []string{s})
		if err != nil {
			return nil, err
		}
		sel = sel.Add(*r)
	}
	exprs, _, _ := unstructured.NestedSlice(hs, "matchExpressions")
	for _, e := range exprs {
		m, _ := e.(map[string]any)
		var values []string
		vs, _, _ := unstructured.NestedStringSlice(m, "values")
		values = append(values, vs...)
		r, err := labels.NewRequirement(str(m, "key"), selection.Operator(strings.ToLower(str(m, "operator"))), values)
		if err != nil {
			return nil, err
		}
		sel = sel.Add(*r)
	}
	return sel, nil
}

// applyHost server-side applies the host fields CAPM3 owns: the consumer
// and, once provisioning is due, image, user data and rendered data.
// Applying without provisioning fields gives them back. The host's
// resourceVersion is a precondition: two machines cannot claim one host.
//
// CAPM3 also makes the Metal3Machine an owner of the host; the simulator
// leaves that out, so that garbage collection can never delete a host.
func (p *pass) applyHost(host, m3m *unstructured.Unstructured, provisioning map[string]any) error {
	a := newObject(kindBareMetalHost, host.GetNamespace(), host.GetName())
	a.SetResourceVersion(host.GetResourceVersion())
	spec := map[string]any{}
	if m3m != nil {
		spec["consumerRef"] = map[string]any{
			"apiVersion": m3m.GetAPIVersion(), "kind": "Metal3Machine",
			"name": m3m.GetName(), "namespace": m3m.GetNamespace(),
		}
	}
	for k, v := range provisioning {
		spec[k] = v
	}
	if len(spec) > 0 {
		a.Object["spec"] = spec
	}
	return p.apply(controllerCAPM3, a)
}

// provisioningFields are the host fields CAPM3 sets to deploy the machine.
func provisioningFields(m3m, machine, data *unstructured.Unstructured) map[string]any {
	img := object(m3m.Object, "spec", "image")
	image := map[string]any{"url": str(img, "url")}
	for from, to := range map[string]string{"checksum": "checksum", "checksumType": "checksumType", "diskFormat": "format"} {
		if v := str(img, from); v != "" {
			image[to] = v
		}
	}
	fields := map[string]any{
		"image":    image,
		"userData": map[string]any{"name": str(machine.Object, "spec", "bootstrap", "dataSecretName"), "namespace": m3m.GetNamespace()},
	}
	if method := str(m3m.Object, "spec", "customDeploy", "method"); method != "" {
		fields["customDeploy"] = map[string]any{"method": method}
		if str(img, "url") == "" {
			delete(fields, "image")
		}
	}
	if data != nil {
		for _, f := range []string{"metaData", "networkData"} {
			if ref := object(data.Object, "spec", f); ref != nil {
				fields[f] = ref
			}
		}
	}
	return fields
}

// releaseHosts gives back the hosts whose Metal3Machine is gone: CAPM3
// clears the consumer and the image, and the BareMetal Operator then
// deprovisions the host. Only hosts the simulator claimed are touched.
func (p *pass) releaseHosts() error {
	var errs []error
	for _, h := range p.w.list(kindBareMetalHost) {
		ref := object(h.Object, "spec", "consumerRef")
		_, paused := h.GetAnnotations()[hostPausedAnnotation]
		if ref == nil || ref["kind"] != "Metal3Machine" || paused || !managedBy(h, controllerCAPM3) {
			continue
		}
		name, _ := ref["name"].(string)
		if p.w.get(kindMetal3Machine, name) != nil {
			continue
		}
		if err := p.applyHost(h, nil, nil); err != nil {
			errs = append(errs, err)
			continue
		}
		p.emit(controllerCAPM3, h, "released by Metal3Machine %s", name)
	}
	return errors.Join(errs...)
}

// managedBy reports whether the controller's field manager has applied
// fields of obj.
func managedBy(obj *unstructured.Unstructured, controller string) bool {
	for _, f := range obj.GetManagedFields() {
		if f.Manager == fieldManager(controller) && f.Operation == "Apply" {
			return true
		}
	}
	return false
}

// hostAddresses are the machine addresses CAPM3 copies from the host's
// inspection data.
func hostAddresses(host *unstructured.Unstructured) []any {
	var out []any
	nics, _, _ := unstructured.NestedSlice(host.Object, "status", "hardware", "nics")
	for _, n := range nics {
		if ip := str(n.(map[string]any), "ip"); ip != "" {
			out = append(out, map[string]any{"type": "InternalIP", "address": ip})
		}
	}
	if hn := str(host.Object, "status", "hardware", "hostname"); hn != "" {
		out = append(out, map[string]any{"type": "Hostname", "address": hn}, map[string]any{"type": "InternalDNS", "address": hn})
	}
	return out
}
