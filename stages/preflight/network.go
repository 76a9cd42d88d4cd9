package preflight

import "slices"

// checkNetwork checks one cluster's networks against each other: pods and
// services of the same IP families, node networks of the cluster's
// family, and no overlap between pods, services and node networks. Seed
// 004's rule is that the pod and service networks must not exist in the
// infrastructure, so an overlap is reported on the pod or service side.
func (v *validation) checkNetwork(n *network) {
	podFamilies, serviceFamilies := familiesOf(n.pods), familiesOf(n.services)
	if len(podFamilies) > 0 && len(serviceFamilies) > 0 {
		mismatch := false
		for _, p := range n.pods {
			if f := familyOf(p.prefix.Addr()); !serviceFamilies.has(f) {
				v.errorf(p.object, p.field, "%s is %s but the service network is %s (%s); pods and services need the same IP families",
					p.label(), f, serviceFamilies, refList(n.services, p.object))
				mismatch = true
			}
		}
		// One mismatch is one mistake: say it once, on the pod side,
		// unless only the services have a family the pods lack.
		for _, s := range n.services {
			if f := familyOf(s.prefix.Addr()); !mismatch && !podFamilies.has(f) {
				v.errorf(s.object, s.field, "%s is %s but the pod network is %s (%s); pods and services need the same IP families",
					s.label(), f, podFamilies, refList(n.pods, s.object))
			}
		}
	}

	nodes := n.nodes()
	if clusterFamilies := serviceFamilies; len(clusterFamilies) > 0 {
		for _, c := range nodes {
			if f := familyOf(c.prefix.Addr()); !clusterFamilies.has(f) {
				v.errorf(c.object, c.field, "%s is an %s network but the cluster is %s (service CIDR %s); nodes need addresses of the cluster's family",
					c.label(), f, clusterFamilies, refList(n.services, c.object))
			}
		}
	}

	for _, p := range n.pods {
		for _, s := range n.services {
			if p.prefix.Overlaps(s.prefix) {
				v.errorf(p.object, p.field, "%s overlaps the service CIDR %s; pods and services need separate ranges",
					p.label(), s.ref(p.object))
			}
		}
	}
	for _, x := range slices.Concat(n.pods, n.services) {
		for _, c := range nodes {
			if x.prefix.Overlaps(c.prefix) {
				v.errorf(x.object, x.field, "%s overlaps the %s %s; the %s must be a range no host network uses",
					x.label(), c.role, c.ref(x.object), x.role)
			}
		}
	}
}
