package preflight

import (
	"fmt"
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// clusterNetwork is what a Cluster API Cluster says of its networks.
type clusterNetwork struct {
	object, namespace, name string
	pods, services          cidrBlocks
}

// cidrBlocks is one of a Cluster's cidrBlocks lists.
type cidrBlocks struct {
	field string
	// set: the list has entries; valid: every entry parsed.
	set, valid bool
	cidrs      []cidr
}

func isCluster(obj *unstructured.Unstructured) bool {
	gvk := obj.GroupVersionKind()
	return gvk.Group == "cluster.x-k8s.io" && gvk.Kind == "Cluster"
}

func (v *validation) readCluster(obj *unstructured.Unstructured) *clusterNetwork {
	c := &clusterNetwork{object: objectRef(obj), namespace: obj.GetNamespace(), name: obj.GetName()}
	c.pods = v.readBlocks(c.object, obj, rolePod, "pods")
	c.services = v.readBlocks(c.object, obj, roleService, "services")
	return c
}

// readBlocks reads spec.clusterNetwork.<kind>.cidrBlocks: at most one
// network per IP family (two for dual stack).
func (v *validation) readBlocks(object string, obj *unstructured.Unstructured, role, kind string) cidrBlocks {
	path := []string{"spec", "clusterNetwork", kind, "cidrBlocks"}
	b := cidrBlocks{field: strings.Join(path, "."), valid: true}
	raw, found, err := unstructured.NestedFieldNoCopy(obj.Object, path...)
	if err != nil {
		v.errorf(object, b.field, "cannot be read: %v", err)
		b.valid = false
		return b
	}
	if !found || raw == nil {
		return b
	}
	list, ok := raw.([]any)
	if !ok {
		v.errorf(object, b.field, "expected a list of CIDRs, found %s", describe(raw))
		b.valid = false
		return b
	}
	b.set = len(list) > 0
	for i, e := range list {
		f := fmt.Sprintf("%s[%d]", b.field, i)
		s, ok := e.(string)
		if !ok {
			v.errorf(object, f, "expected a CIDR string, found %s", describe(e))
			b.valid = false
			continue
		}
		p, err := parseCIDR(s)
		if err != nil {
			v.errorf(object, f, "%v", err)
			b.valid = false
			continue
		}
		b.cidrs = append(b.cidrs, cidr{prefix: p, object: object, field: f, role: role})
	}
	switch fs := familiesOf(b.cidrs); {
	case len(list) > 2:
		v.errorf(object, b.field, "%d blocks; expected one, or two of different IP families for dual stack", len(list))
		b.valid = false
	case len(b.cidrs) == 2 && len(fs) == 1:
		v.errorf(object, b.field, "two %s blocks; a dual-stack cluster has one IPv4 and one IPv6 block", fs[0])
		b.valid = false
	}
	return b
}

// network is the Cluster's network when no network ConfigMap is given,
// defaults filled in. The Cluster knows no node networks.
func (c *clusterNetwork) network() *network {
	n := &network{object: c.object, clusterNamespace: c.namespace, clusterName: c.name}
	n.pods = c.pods.orDefault(c.object, DefaultPodCIDR, rolePod)
	n.services = c.services.orDefault(c.object, DefaultServiceCIDR, roleService)
	return n
}

// orDefault returns the blocks, the default when they are unset, or
// nothing when they are wrong: checking a list already reported as wrong
// against the other networks would only add noise.
func (b cidrBlocks) orDefault(object, def, role string) []cidr {
	if !b.valid {
		return nil
	}
	if b.set {
		return b.cidrs
	}
	return []cidr{{prefix: netip.MustParsePrefix(def), object: object, field: b.field, defaulted: true, role: role}}
}

// agree checks that a Cluster's networks, where it sets them, are the
// ones of the network ConfigMap.
func (v *validation) agree(c *clusterNetwork, n *network) {
	for _, side := range []struct {
		blocks cidrBlocks
		want   []cidr
		role   string
	}{
		{c.pods, n.pods, rolePod},
		{c.services, n.services, roleService},
	} {
		if !side.blocks.set || !side.blocks.valid || len(side.want) == 0 || samePrefixes(side.blocks.cidrs, side.want) {
			continue
		}
		v.errorf(c.object, side.blocks.field, "%s disagrees with the %s %s; set both to the same network",
			prefixList(side.blocks.cidrs), side.role, refList(side.want, c.object))
	}
}

func samePrefixes(a, b []cidr) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		found := false
		for _, y := range b {
			found = found || x.prefix == y.prefix
		}
		if !found {
			return false
		}
	}
	return true
}

func prefixList(cs []cidr) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = c.prefix.String()
	}
	return "[" + strings.Join(s, ", ") + "]"
}

func refList(cs []cidr, from string) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = c.ref(from)
	}
	return strings.Join(s, " and ")
}
