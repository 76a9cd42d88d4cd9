package sim

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// metal3SecretType is the type of the Secrets CAPM3 renders.
const metal3SecretType = "infrastructure.cluster.x-k8s.io/secret"

// machineData returns the Metal3Data rendered for the Metal3Machine and
// whether it is ready. A machine without a dataTemplate needs none.
func (p *pass) machineData(m3m *unstructured.Unstructured) (*unstructured.Unstructured, bool) {
	if str(m3m.Object, "spec", "dataTemplate", "name") == "" {
		return nil, true
	}
	claim := p.w.get(kindMetal3DataClaim, m3m.GetName())
	if claim == nil || !hasOwner(claim, m3m) {
		return nil, false
	}
	data := p.w.get(kindMetal3Data, str(claim.Object, "status", "renderedData", "name"))
	return data, data != nil && flag(data.Object, "status", "ready")
}

// claimData creates the Metal3DataClaim through which CAPM3 asks the
// machine's Metal3DataTemplate for an index and rendered data.
func (p *pass) claimData(m3m *unstructured.Unstructured) error {
	if p.w.get(kindMetal3DataClaim, m3m.GetName()) != nil {
		return nil
	}
	claim := newObject(kindMetal3DataClaim, m3m.GetNamespace(), m3m.GetName())
	claim.SetLabels(clusterLabels(m3m))
	claim.SetOwnerReferences([]metav1.OwnerReference{ownerRef(m3m, true)})
	tmpl := str(m3m.Object, "spec", "dataTemplate", "name")
	set(claim.Object, map[string]any{"name": tmpl, "namespace": m3m.GetNamespace()}, "spec", "template")
	if err := p.create(controllerCAPM3, claim); err != nil {
		return err
	}
	p.emit(controllerCAPM3, claim, "created for Metal3Machine %s from Metal3DataTemplate %s", m3m.GetName(), tmpl)
	return nil
}

// reconcileDataTemplates plays CAPM3's Metal3DataTemplate controller:
// each new claim gets the lowest free index and a Metal3Data named
// <template>-<index>.
func (p *pass) reconcileDataTemplates() error {
	var errs []error
	for _, claim := range p.w.list(kindMetal3DataClaim) {
		if claim.GetDeletionTimestamp() != nil || str(claim.Object, "status", "renderedData", "name") != "" {
			continue
		}
		tmpl := p.w.get(kindMetal3DataTemplate, str(claim.Object, "spec", "template", "name"))
		if tmpl == nil {
			continue // the claim waits for its template
		}
		if err := p.allocateData(tmpl, claim); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (p *pass) allocateData(tmpl, claim *unstructured.Unstructured) error {
	used := map[int64]bool{}
	var data *unstructured.Unstructured
	for _, d := range p.w.list(kindMetal3Data) {
		if str(d.Object, "spec", "template", "name") != tmpl.GetName() {
			continue
		}
		if str(d.Object, "spec", "claim", "name") == claim.GetName() {
			data = d // an earlier pass created it
		}
		if i, ok := integer(d.Object, "spec", "index"); ok {
			used[i] = true
		}
	}
	if data == nil {
		index := int64(0)
		for used[index] {
			index++
		}
		data = newObject(kindMetal3Data, tmpl.GetNamespace(), tmpl.GetName()+"-"+strconv.FormatInt(index, 10))
		data.SetLabels(claim.GetLabels())
		refs := []metav1.OwnerReference{ownerRef(tmpl, true), ownerRef(claim, false)}
		refs[1].BlockOwnerDeletion = nil
		data.SetOwnerReferences(refs)
		set(data.Object, map[string]any{
			"index":    index,
			"template": map[string]any{"name": tmpl.GetName(), "namespace": tmpl.GetNamespace()},
			"claim":    map[string]any{"name": claim.GetName(), "namespace": claim.GetNamespace()},
		}, "spec")
		if err := p.create(controllerCAPM3, data); err != nil {
			return err
		}
		p.emit(controllerCAPM3, data, "index %d allocated to Metal3DataClaim %s", index, claim.GetName())
	}
	next := claim.DeepCopy()
	set(next.Object, map[string]any{"name": data.GetName(), "namespace": data.GetNamespace()}, "status", "renderedData")
	if _, err := p.updateStatus(controllerCAPM3, claim, next); err != nil {
		return err
	}
	return p.recordIndexes(tmpl)
}

// recordIndexes writes the template's status.indexes: which claim holds
// which index.
func (p *pass) recordIndexes(tmpl *unstructured.Unstructured) error {
	var indexes []any
	for _, d := range p.w.list(kindMetal3Data) {
		i, ok := integer(d.Object, "spec", "index")
		if ok && str(d.Object, "spec", "template", "name") == tmpl.GetName() {
			indexes = append(indexes, map[string]any{"index": i, "name": str(d.Object, "spec", "claim", "name")})
		}
	}
	next := tmpl.DeepCopy()
	if len(indexes) == 0 {
		unset(next.Object, "status", "indexes")
	} else {
		set(next.Object, indexes, "status", "indexes")
	}
	if sameJSON(next.Object["status"], tmpl.Object["status"]) {
		return nil
	}
	set(next.Object, p.now.UTC().Format(time.RFC3339), "status", "lastUpdated")
	_, err := p.updateStatus(controllerCAPM3, tmpl, next)
	return err
}

// reconcileData plays CAPM3's Metal3Data controller: it renders the
// machine's meta data and network data into Secrets once its host is
// known, and marks the data ready.
func (p *pass) reconcileData() error {
	var errs []error
	for _, data := range p.w.list(kindMetal3Data) {
		if data.GetDeletionTimestamp() != nil || flag(data.Object, "status", "ready") {
			continue
		}
		claim := p.w.get(kindMetal3DataClaim, str(data.Object, "spec", "claim", "name"))
		if claim == nil {
			continue
		}
		ref := controllerRef(claim)
		if ref == nil {
			continue
		}
		m3m := p.w.byUID(kindMetal3Machine, ref.UID)
		tmpl := p.w.get(kindMetal3DataTemplate, str(data.Object, "spec", "template", "name"))
		if m3m == nil || tmpl == nil {
			continue
		}
		host := p.hostOf(m3m)
		if host == nil {
			continue // the data names the host: wait until CAPM3 has one
		}
		if err := p.renderData(data, tmpl, m3m, host); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (p *pass) renderData(data, tmpl, m3m, host *unstructured.Unstructured) error {
	addrs, ready, err := p.poolAddresses(data, tmpl)
	if err != nil || !ready {
		return err // the claims wait for their addresses
	}
	machineName := ""
	if ref := controllerRef(m3m); ref != nil {
		machineName = ref.Name
	}
	index, _ := integer(data.Object, "spec", "index")
	meta := map[string]any{
		"uuid":             string(host.GetUID()),
		"metal3-namespace": m3m.GetNamespace(),
		"metal3-name":      m3m.GetName(),
		"name":             machineName,
		"local-hostname":   machineName,
		"index":            index,
		"providerid":       fmt.Sprintf("%s/%s/%s", m3m.GetNamespace(), host.GetName(), m3m.GetName()),
	}
	network := map[string]any{
		"links":    []any{map[string]any{"id": "enp1s0", "type": "phy", "ethernet_mac_address": str(host.Object, "spec", "bootMACAddress")}},
		"networks": []any{},
		"services": []any{},
	}
	addPoolData(tmpl, addrs, meta, network)
	next := data.DeepCopy()
	for _, s := range []struct {
		field, suffix, key string
		content            map[string]any
		wanted             bool
	}{
		{"metaData", "-metadata", "metaData", meta, has(tmpl.Object, "spec", "metaData")},
		{"networkData", "-networkdata", "networkData", network, has(tmpl.Object, "spec", "networkData")},
	} {
		if !s.wanted {
			continue
		}
		name := m3m.GetName() + s.suffix
		if err := p.createSecret(controllerCAPM3, data, name, metal3SecretType, map[string]any{s.key: s.content}); err != nil {
			return err
		}
		set(next.Object, map[string]any{"name": name, "namespace": data.GetNamespace()}, "spec", s.field)
	}
	if _, err := p.update(controllerCAPM3, data, next); err != nil {
		return err
	}
	data = p.w.get(kindMetal3Data, data.GetName())
	done := data.DeepCopy()
	set(done.Object, true, "status", "ready")
	if _, err := p.updateStatus(controllerCAPM3, data, done); err != nil {
		return err
	}
	p.emit(controllerCAPM3, data, "meta data and network data rendered for host %s", host.GetName())
	return nil
}

// addPoolData puts the addresses allocated from IP pools where the
// template asks for them: meta data keys of the *FromPool lists, and the
// ipv4 networks that take ipAddressFromIPPool. Networks without a pool
// use DHCP.
func addPoolData(tmpl *unstructured.Unstructured, addrs map[string]*unstructured.Unstructured, meta, network map[string]any) {
	for list, field := range map[string]string{
		"ipAddressesFromPool": "address", "prefixesFromPool": "prefix",
		"gatewaysFromPool": "gateway", "dnsServersFromPool": "dnsServers",
	} {
		entries, _, _ := unstructured.NestedSlice(tmpl.Object, "spec", "metaData", list)
		for _, e := range entries {
			m, _ := e.(map[string]any)
			if a := addrs[str(m, "name")]; a != nil {
				meta[str(m, "key")] = object(a.Object, "spec")[field]
			}
		}
	}
	var networks []any
	for _, family := range []string{"ipv4", "ipv6"} {
		items, _, _ := unstructured.NestedSlice(tmpl.Object, "spec", "networkData", "networks", family)
		for _, it := range items {
			m, _ := it.(map[string]any)
			n := map[string]any{"id": str(m, "id"), "link": str(m, "link"), "type": family}
			if a := addrs[str(m, "ipAddressFromIPPool")]; a != nil {
				n["ip_address"] = str(a.Object, "spec", "address")
				if prefix, ok := integer(a.Object, "spec", "prefix"); ok {
					n["prefix"] = prefix
				}
			}
			networks = append(networks, n)
		}
		dhcp, _, _ := unstructured.NestedSlice(tmpl.Object, "spec", "networkData", "networks", family+"DHCP")
		for _, it := range dhcp {
			m, _ := it.(map[string]any)
			networks = append(networks, map[string]any{"id": str(m, "id"), "link": str(m, "link"), "type": family + "_dhcp"})
		}
	}
	network["networks"] = networks
}

// createSecret creates a Secret owned by owner whose keys hold YAML; a
// Secret already there is kept, as CAPM3 and the kubeadm bootstrap
// provider keep it to re-provision a node the same way.
func (p *pass) createSecret(controller string, owner *unstructured.Unstructured, name, typ string, content map[string]any) error {
	data := map[string][]byte{}
	for k, v := range content {
		if b, ok := v.([]byte); ok {
			data[k] = b
			continue
		}
		b, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("render Secret %s/%s: %w", owner.GetNamespace(), name, err)
		}
		data[k] = b
	}
	_, err := p.createSecretFor(controller, owner, name, typ, clusterLabels(owner), data)
	return err
}

// createSecretFor creates Secret name in owner's namespace, controlled by
// owner, unless it exists; it reports whether it created it.
func (p *pass) createSecretFor(controller string, owner *unstructured.Unstructured, name, typ string, labels map[string]string, data map[string][]byte) (bool, error) {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: owner.GetNamespace(), Labels: labels,
			OwnerReferences: []metav1.OwnerReference{ownerRef(owner, true)},
		},
		Type: corev1.SecretType(typ),
		Data: data,
	}
	err := p.s.api.Create(p.ctx, s, client.FieldOwner(fieldManager(controller)))
	switch {
	case apierrors.IsAlreadyExists(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("create Secret %s/%s: %w", s.Namespace, name, err)
	}
	return true, nil
}

// deleteSecret deletes a Secret the simulator rendered.
func (p *pass) deleteSecret(name string) error {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.ns}}
	if err := p.s.api.Delete(p.ctx, s); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete Secret %s/%s: %w", p.ns, name, err)
	}
	return nil
}

// clusterLabels are the cluster-name label of obj, which Cluster API and
// the providers copy onto every object they create for a cluster.
func clusterLabels(obj *unstructured.Unstructured) map[string]string {
	if c := obj.GetLabels()[clusterNameLabel]; c != "" {
		return map[string]string{clusterNameLabel: c}
	}
	return nil
}
