package sim

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The Metal3 IP address manager's kinds. They are optional: without their
// CRDs the simulator renders machine data without pool addresses.
var (
	kindIPPool    = schema.GroupVersionKind{Group: "ipam.metal3.io", Version: "v1alpha1", Kind: "IPPool"}
	kindIPClaim   = schema.GroupVersionKind{Group: "ipam.metal3.io", Version: "v1alpha1", Kind: "IPClaim"}
	kindIPAddress = schema.GroupVersionKind{Group: "ipam.metal3.io", Version: "v1alpha1", Kind: "IPAddress"}
)

// poolsOf lists the IPPools a Metal3DataTemplate takes addresses from:
// every ipAddressFromIPPool and fromIPPool value, and the names of the
// *FromPool lists of its meta data.
func poolsOf(tmpl *unstructured.Unstructured) []string {
	var pools []string
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch t := v.(type) {
		case map[string]any:
			for k, child := range t {
				walk(k, child)
			}
		case []any:
			for _, item := range t {
				if m, ok := item.(map[string]any); ok && strings.HasSuffix(key, "FromPool") {
					if name := str(m, "name"); name != "" {
						pools = append(pools, name)
					}
				}
				walk(key, item)
			}
		case string:
			if key == "ipAddressFromIPPool" || key == "fromIPPool" {
				pools = append(pools, t)
			}
		}
	}
	walk("spec", tmpl.Object["spec"])
	slices.Sort(pools)
	return slices.Compact(pools)
}

// poolAddresses claims an address from each pool the data's template
// names, as CAPM3 does before it renders the data, and returns the
// addresses allocated so far by pool name. ready is false while a claim
// waits for its address.
func (p *pass) poolAddresses(data, tmpl *unstructured.Unstructured) (addrs map[string]*unstructured.Unstructured, ready bool, err error) {
	addrs = map[string]*unstructured.Unstructured{}
	pools := poolsOf(tmpl)
	if len(pools) > 0 && !p.s.served(kindIPPool) {
		return addrs, true, nil
	}
	ready = true
	for _, pool := range pools {
		name := data.GetName() + "-" + pool
		claim := p.w.get(kindIPClaim, name)
		if claim == nil {
			claim = newObject(kindIPClaim, data.GetNamespace(), name)
			claim.SetLabels(clusterLabels(data))
			claim.SetOwnerReferences([]metav1.OwnerReference{ownerRef(data, true)})
			set(claim.Object, map[string]any{"name": pool, "namespace": data.GetNamespace()}, "spec", "pool")
			if err := p.create(controllerCAPM3, claim); err != nil {
				return nil, false, err
			}
			p.emit(controllerCAPM3, claim, "created for Metal3Data %s from IPPool %s", data.GetName(), pool)
		}
		addr := p.w.get(kindIPAddress, str(claim.Object, "status", "address", "name"))
		if addr == nil {
			ready = false
			continue
		}
		addrs[pool] = addr
	}
	return addrs, ready, nil
}

// reconcileIPClaims plays the IP address manager: each claim gets the
// first free address of its pool, an IPAddress named after it, and a
// line in the pool's status.indexes.
func (p *pass) reconcileIPClaims() error {
	if !p.s.served(kindIPClaim) {
		return nil
	}
	var errs []error
	for _, claim := range p.w.list(kindIPClaim) {
		if claim.GetDeletionTimestamp() != nil || str(claim.Object, "status", "address", "name") != "" {
			continue
		}
		pool := p.w.get(kindIPPool, str(claim.Object, "spec", "pool", "name"))
		if pool == nil {
			continue // the claim waits for its pool
		}
		if err := p.allocateAddress(pool, claim); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (p *pass) allocateAddress(pool, claim *unstructured.Unstructured) error {
	used := map[string]bool{}
	var addr *unstructured.Unstructured
	for _, a := range p.w.list(kindIPAddress) {
		if str(a.Object, "spec", "pool", "name") != pool.GetName() {
			continue
		}
		used[str(a.Object, "spec", "address")] = true
		if str(a.Object, "spec", "claim", "name") == claim.GetName() {
			addr = a // an earlier pass allocated it
		}
	}
	if addr == nil {
		pre := map[string]string{}
		for k, v := range object(pool.Object, "spec", "preAllocations") {
			if s, ok := v.(string); ok {
				pre[k] = s
				if k != claim.GetName() {
					used[s] = true
				}
			}
		}
		spec, err := freeAddress(pool, used, pre[claim.GetName()])
		if err != nil {
			next := claim.DeepCopy()
			set(next.Object, err.Error(), "status", "errorMessage")
			_, werr := p.updateStatus(controllerCAPM3, claim, next)
			return werr
		}
		spec["pool"] = map[string]any{"name": pool.GetName(), "namespace": pool.GetNamespace()}
		spec["claim"] = map[string]any{"name": claim.GetName(), "namespace": claim.GetNamespace()}
		name := strings.TrimRight(str(pool.Object, "spec", "namePrefix")+"-"+strings.NewReplacer(".", "-", ":", "-").Replace(str(spec, "address")), "-")
		addr = newObject(kindIPAddress, pool.GetNamespace(), name)
		addr.SetLabels(claim.GetLabels())
		refs := []metav1.OwnerReference{ownerRef(pool, false), ownerRef(claim, true)}
		refs[0].BlockOwnerDeletion = nil
		addr.SetOwnerReferences(refs)
		addr.Object["spec"] = spec
		if err := p.create(controllerCAPM3, addr); err != nil {
			return err
		}
		p.emit(controllerCAPM3, addr, "%s allocated from IPPool %s to IPClaim %s", str(spec, "address"), pool.GetName(), claim.GetName())
	}
	next := claim.DeepCopy()
	set(next.Object, map[string]any{"name": addr.GetName(), "namespace": addr.GetNamespace()}, "status", "address")
	unset(next.Object, "status", "errorMessage")
	if _, err := p.updateStatus(controllerCAPM3, claim, next); err != nil {
		return err
	}
	return p.recordAllocations(pool)
}

// freeAddress returns the spec of the first address of the pool's ranges
// that is not used (or the pre-allocated one), with the prefix, gateway
// and DNS servers of its range.
func freeAddress(pool *unstructured.Unstructured, used map[string]bool, preallocated string) (map[string]any, error) {
	spec := object(pool.Object, "spec")
	ranges, _, _ := unstructured.NestedSlice(pool.Object, "spec", "pools")
	for _, r := range ranges {
		rm, _ := r.(map[string]any)
		start, end, err := addressRange(rm)
		if err != nil {
			return nil, fmt.Errorf("IPPool %s: %w", pool.GetName(), err)
		}
		for a := start; a.IsValid() && a.Compare(end) <= 0; a = a.Next() {
			if preallocated != "" && a.String() != preallocated || preallocated == "" && used[a.String()] {
				continue
			}
			out := map[string]any{"address": a.String()}
			for _, f := range []string{"prefix", "gateway", "dnsServers"} {
				if v, ok := rm[f]; ok {
					out[f] = v
				} else if v, ok := spec[f]; ok {
					out[f] = v
				}
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("IPPool %s has no free address", pool.GetName())
}

// addressRange reads a pool range: start and end, or a subnet whose first
// and last host addresses bound it.
func addressRange(r map[string]any) (start, end netip.Addr, err error) {
	if s := str(r, "subnet"); s != "" && str(r, "start") == "" {
		prefix, err := netip.ParsePrefix(s)
		if err != nil {
			return start, end, fmt.Errorf("subnet %q: %w", s, err)
		}
		network := prefix.Masked().Addr()
		last := network.AsSlice()
		for i := prefix.Bits(); i < len(last)*8; i++ {
			last[i/8] |= 1 << (7 - i%8)
		}
		broadcast, _ := netip.AddrFromSlice(last)
		return network.Next(), broadcast.Prev(), nil
	}
	if start, err = netip.ParseAddr(str(r, "start")); err != nil {
		return start, end, fmt.Errorf("start %q: %w", str(r, "start"), err)
	}
	if end, err = netip.ParseAddr(str(r, "end")); err != nil {
		return start, end, fmt.Errorf("end %q: %w", str(r, "end"), err)
	}
	return start, end, nil
}

// recordAllocations writes the pool's status.indexes: which claim holds
// which address.
func (p *pass) recordAllocations(pool *unstructured.Unstructured) error {
	indexes := map[string]any{}
	for _, a := range p.w.list(kindIPAddress) {
		if str(a.Object, "spec", "pool", "name") == pool.GetName() {
			indexes[str(a.Object, "spec", "claim", "name")] = str(a.Object, "spec", "address")
		}
	}
	next := pool.DeepCopy()
	set(next.Object, indexes, "status", "indexes")
	if sameJSON(next.Object["status"], pool.Object["status"]) {
		return nil
	}
	set(next.Object, p.now.UTC().Format(time.RFC3339), "status", "lastUpdated")
	_, err := p.updateStatus(controllerCAPM3, pool, next)
	return err
}

// releaseAddresses deletes the data's IP claims and their addresses, and
// updates the pools.
func (p *pass) releaseAddresses(data *unstructured.Unstructured) error {
	if !p.s.served(kindIPClaim) {
		return nil
	}
	var errs []error
	for _, claim := range p.w.owned(kindIPClaim, data) {
		pool := p.w.get(kindIPPool, str(claim.Object, "spec", "pool", "name"))
		for _, a := range p.w.owned(kindIPAddress, claim) {
			errs = append(errs, p.remove(a))
		}
		errs = append(errs, p.remove(claim))
		if pool != nil {
			errs = append(errs, p.recordAllocations(pool))
		}
	}
	return errors.Join(errs...)
}
