package preflight

import (
	"slices"
	"sort"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// network is the settings of one cluster's networks: from the network
// ConfigMap, or, without one, from a Cluster's clusterNetwork.
type network struct {
	// object defines the network.
	object string
	// clusterNamespace and clusterName identify the Cluster the network
	// comes from, for IPPools that name it; empty for a ConfigMap.
	clusterNamespace, clusterName string
	controlPlane, workload        []cidr
	pods, services                []cidr
}

// nodes returns the control-plane and workload-plane networks, each
// network once.
func (n *network) nodes() []cidr {
	var out []cidr
	for _, c := range slices.Concat(n.controlPlane, n.workload) {
		if !slices.ContainsFunc(out, func(o cidr) bool { return o.prefix == c.prefix }) {
			out = append(out, c)
		}
	}
	return out
}

func (n *network) summary() Network {
	s := Network{Object: n.object}
	for _, c := range n.controlPlane {
		s.ControlPlaneCIDRs = append(s.ControlPlaneCIDRs, c.prefix.String())
	}
	for _, c := range n.workload {
		s.WorkloadPlaneCIDRs = append(s.WorkloadPlaneCIDRs, c.prefix.String())
	}
	for _, c := range n.pods {
		s.PodCIDRs = append(s.PodCIDRs, c.prefix.String())
	}
	for _, c := range n.services {
		s.ServiceCIDRs = append(s.ServiceCIDRs, c.prefix.String())
	}
	return s
}

// validation collects the problems of one Validate call.
type validation struct {
	problems
	// userKeys is set when a KubeadmControlPlane or KubeadmConfigTemplate
	// gives its users SSH keys itself: nodes are reachable without the
	// network ConfigMap's keys.
	userKeys bool
}

// Validate checks the network settings of the given objects and returns
// every problem it finds. Objects other than network ConfigMaps, Cluster
// API Clusters and Metal3 IPPools are ignored, and so are nil ones.
//
// With a network ConfigMap, its settings are the cluster's network and
// every Cluster must agree with them; without one, each Cluster's
// clusterNetwork is checked on its own. Defaults fill in what is unset:
// pods 10.233.0.0/16, services 10.96.0.0/12, workload-plane networks the
// control-plane ones. IPPools are checked against the network of the
// Cluster they name, else against every network.
func Validate(objects []*unstructured.Unstructured) Report {
	v := &validation{}
	var (
		configs  []*networkConfig
		clusters []*clusterNetwork
		pools    []*ipPool
		order    = map[string]int{}
		checked  = []string{}
	)
	for _, obj := range objects {
		if obj == nil || obj.Object == nil {
			continue
		}
		v.userKeys = v.userKeys || carriesUserKeys(obj)
		switch {
		case isNetworkConfig(obj):
			configs = append(configs, v.readConfigMap(obj))
		case isCluster(obj):
			clusters = append(clusters, v.readCluster(obj))
		case isIPPool(obj):
			pools = append(pools, v.readIPPool(obj))
		default:
			continue
		}
		if _, seen := order[objectRef(obj)]; !seen {
			order[objectRef(obj)] = len(order)
			checked = append(checked, objectRef(obj))
		}
	}

	var networks []*network
	for i, c := range configs {
		if i > 0 {
			v.errorf(c.object, "metadata.labels", "a second network ConfigMap; %s already describes the network, and one overlay describes one cluster's network",
				configs[0].object)
		}
		v.checkNetwork(&c.network)
		v.checkProxies(c)
		v.checkSSHKeys(c)
		networks = append(networks, &c.network)
	}
	if len(configs) > 0 {
		for _, cl := range clusters {
			v.agree(cl, &configs[0].network)
		}
	} else {
		for _, cl := range clusters {
			n := cl.network()
			v.checkNetwork(n)
			networks = append(networks, n)
		}
	}
	for _, p := range pools {
		v.checkPool(p, poolNetworks(p, networks, len(configs) > 0))
	}

	report := Report{Checked: checked, Problems: append([]Problem{}, v.list...)}
	for _, n := range networks {
		report.Networks = append(report.Networks, n.summary())
	}
	// Group the problems by object, in the order of the objects, so that
	// a reader fixes one object at a time.
	sort.SliceStable(report.Problems, func(i, j int) bool {
		return order[report.Problems[i].Object] < order[report.Problems[j].Object]
	})
	return report
}

// poolNetworks returns the networks an IPPool's addresses are checked
// against: the network ConfigMap's, else the network of the Cluster the
// pool names, else every Cluster's.
func poolNetworks(p *ipPool, networks []*network, fromConfig bool) []*network {
	if fromConfig {
		return networks[:1]
	}
	var named []*network
	for _, n := range networks {
		if p.clusterName != "" && n.clusterName == p.clusterName && n.clusterNamespace == p.namespace {
			named = append(named, n)
		}
	}
	if len(named) > 0 {
		return named
	}
	return networks
}

// objectRef names an object as `Kind namespace/name`.
func objectRef(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return obj.GetKind() + " " + ns + "/" + obj.GetName()
	}
	return obj.GetKind() + " " + obj.GetName()
}
