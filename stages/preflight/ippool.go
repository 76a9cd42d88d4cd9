package preflight

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// ipPool is what a Metal3 IPAM IPPool hands out.
type ipPool struct {
	object, namespace, clusterName string
	ranges                         []poolRange
}

// poolRange is the addresses of one entry of spec.pools.
type poolRange struct {
	field string
	addrs addrRange
}

func isIPPool(obj *unstructured.Unstructured) bool {
	gvk := obj.GroupVersionKind()
	return gvk.Group == "ipam.metal3.io" && gvk.Kind == "IPPool"
}

// readIPPool checks the syntax of every entry of spec.pools and returns
// the address range of each valid one. An entry's addresses run from
// start (else the subnet's first address) to end (else the end of the
// subnet, or of start/prefix, or start alone).
func (v *validation) readIPPool(obj *unstructured.Unstructured) *ipPool {
	p := &ipPool{object: objectRef(obj), namespace: obj.GetNamespace()}
	spec, ok := obj.Object["spec"].(map[string]any)
	if !ok {
		if obj.Object["spec"] != nil {
			v.errorf(p.object, "spec", "expected a map, found %s", describe(obj.Object["spec"]))
		}
		return p
	}
	p.clusterName, _ = spec["clusterName"].(string)
	specPrefix, _ := v.intField(p.object, "spec.prefix", spec["prefix"])
	pools, ok := spec["pools"].([]any)
	if !ok && spec["pools"] != nil {
		v.errorf(p.object, "spec.pools", "expected a list, found %s", describe(spec["pools"]))
	}
	for i, e := range pools {
		base := fmt.Sprintf("spec.pools[%d]", i)
		m, ok := e.(map[string]any)
		if !ok {
			v.errorf(p.object, base, "expected a map, found %s", describe(e))
			continue
		}
		if r, ok := v.readPoolEntry(p.object, base, m, specPrefix); ok {
			p.ranges = append(p.ranges, poolRange{field: base, addrs: r})
		}
	}
	return p
}

func (v *validation) readPoolEntry(object, base string, m map[string]any, specPrefix int) (addrRange, bool) {
	valid := true
	addr := func(key string) (netip.Addr, bool) {
		raw, set := m[key]
		if !set || raw == nil {
			return netip.Addr{}, false
		}
		s, ok := raw.(string)
		if !ok {
			v.errorf(object, base+"."+key, "expected an IP address, found %s", describe(raw))
			valid = false
			return netip.Addr{}, false
		}
		a, err := parseAddr(s)
		if err != nil {
			v.errorf(object, base+"."+key, "%v", err)
			valid = false
			return netip.Addr{}, false
		}
		return a, true
	}
	start, hasStart := addr("start")
	end, hasEnd := addr("end")
	var subnet netip.Prefix
	hasSubnet := false
	if raw, set := m["subnet"]; set && raw != nil {
		s, ok := raw.(string)
		if !ok {
			v.errorf(object, base+".subnet", "expected a CIDR, found %s", describe(raw))
			valid = false
		} else if p, err := parseCIDR(s); err != nil {
			v.errorf(object, base+".subnet", "%v", err)
			valid = false
		} else {
			subnet, hasSubnet = p, true
		}
	}
	prefixField := base + ".prefix"
	prefix, ok := v.intField(object, prefixField, m["prefix"])
	valid = valid && ok
	if prefix == 0 {
		prefix, prefixField = specPrefix, "spec.prefix"
	}
	if !valid {
		return addrRange{}, false
	}
	if !hasStart && !hasSubnet {
		v.errorf(object, base, "neither start nor subnet: a pool needs one of them to know its addresses")
		return addrRange{}, false
	}

	var fam family
	mixed := false
	for _, a := range []struct {
		addr netip.Addr
		set  bool
	}{{start, hasStart}, {end, hasEnd}, {subnet.Addr(), hasSubnet}} {
		if !a.set {
			continue
		}
		if f := familyOf(a.addr); fam == 0 {
			fam = f
		} else if f != fam {
			mixed = true
		}
	}
	if mixed {
		v.errorf(object, base, "mixes IPv4 and IPv6 addresses (start, end and subnet must be of one family)")
		return addrRange{}, false
	}
	bits := 32
	if fam == ipv6 {
		bits = 128
	}
	if prefix < 0 || prefix > bits {
		v.errorf(object, prefixField, "%d is not a prefix length of %s (0 to %d)", prefix, fam, bits)
		return addrRange{}, false
	}

	r := addrRange{first: start, last: end}
	if !hasStart {
		r.first = subnet.Addr()
	}
	switch {
	case hasEnd:
	case hasSubnet:
		r.last = lastAddr(subnet)
	case prefix > 0:
		r.last = lastAddr(netip.PrefixFrom(start, prefix))
	default:
		r.last = start
	}
	if r.first.Compare(r.last) > 0 {
		v.errorf(object, base, "start %s is after end %s", r.first, r.last)
		return addrRange{}, false
	}
	if hasSubnet && !r.within(subnet) {
		v.errorf(object, base, "addresses %s are not all in the pool's subnet %s", r, subnet)
		return addrRange{}, false
	}
	return r, true
}

// intField reads an optional integer; 0 when unset.
func (v *validation) intField(object, field string, raw any) (int, bool) {
	switch n := raw.(type) {
	case nil:
		return 0, true
	case int64:
		if n >= math.MinInt32 && n <= math.MaxInt32 {
			return int(n), true
		}
	case int:
		if n >= math.MinInt32 && n <= math.MaxInt32 {
			return n, true
		}
	case float64:
		if n == math.Trunc(n) && n >= math.MinInt32 && n <= math.MaxInt32 {
			return int(n), true
		}
	}
	v.errorf(object, field, "expected a prefix length (a whole number), found %s", describe(raw))
	return 0, false
}

// checkPool checks an IPPool's addresses against the networks that apply
// to it: of the cluster's family, inside one control-plane or
// workload-plane network (when those are known), clear of the pod and
// service networks.
func (v *validation) checkPool(p *ipPool, networks []*network) {
	for _, r := range p.ranges {
		fam := familyOf(r.addrs.first)
		for _, n := range networks {
			if fs := familiesOf(n.services); len(fs) > 0 && !fs.has(fam) {
				v.errorf(p.object, r.field, "%s addresses %s, but the cluster is %s (service CIDR %s); nodes need addresses of the cluster's family",
					fam, r.addrs, fs, refList(n.services, p.object))
				continue
			}
			if nodes := n.nodes(); len(nodes) > 0 && !inAny(r.addrs, nodes) {
				v.errorf(p.object, r.field, "addresses %s are outside every control-plane and workload-plane network of %s (%s)",
					r.addrs, n.object, strings.Trim(prefixList(nodes), "[]"))
			}
			for _, x := range slices.Concat(n.pods, n.services) {
				if r.addrs.overlaps(x.prefix) {
					v.errorf(p.object, r.field, "addresses %s overlap the %s %s; node addresses must stay out of it",
						r.addrs, x.role, x.ref(p.object))
				}
			}
		}
	}
}

func inAny(r addrRange, networks []cidr) bool {
	for _, n := range networks {
		if r.within(n.prefix) {
			return true
		}
	}
	return false
}
