package preflight_test

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/capstan-dev/capstan/stages/preflight"
)

// sshKey is a valid authorized_keys line (an Ed25519 key from a fixed seed).
const sshKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAOhB7/zzhC+HXDdGOdLwJln5NYwm6UNXx3chmQSVTG4 ops@example"

// goodData is a network ConfigMap that passes every check; rows change it.
func goodData() map[string]string {
	return map[string]string{
		"controlPlaneCIDRs":  "192.168.10.0/24",
		"workloadPlaneCIDRs": "192.168.20.0/24, 192.168.21.0/24",
		"podCIDR":            "10.233.0.0/16",
		"serviceCIDR":        "10.96.0.0/12",
		"sshAuthorizedKeys":  "# the operators\n" + sshKey + "\n",
	}
}

// with returns goodData changed by pairs of key and value; the value "-"
// removes the key.
func with(kv ...string) map[string]string {
	d := goodData()
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "-" {
			delete(d, kv[i])
			continue
		}
		d[kv[i]] = kv[i+1]
	}
	return d
}

func object(apiVersion, kind, namespace, name string, rest map[string]any) *unstructured.Unstructured {
	obj := map[string]any{
		"apiVersion": apiVersion,
		"kind":       kind,
		"metadata":   map[string]any{"name": name, "namespace": namespace},
	}
	maps.Copy(obj, rest)
	return &unstructured.Unstructured{Object: obj}
}

// networkConfig is the labelled ConfigMap capstan-system/<name>.
func networkConfig(name string, data map[string]string) *unstructured.Unstructured {
	d := map[string]any{}
	for k, v := range data {
		d[k] = v
	}
	obj := object("v1", "ConfigMap", "capstan-system", name, map[string]any{"data": d})
	obj.SetLabels(map[string]string{preflight.ConfigLabel: preflight.NetworkConfig})
	return obj
}

func network(data map[string]string) *unstructured.Unstructured {
	return networkConfig("network", data)
}

// cluster is a Cluster API Cluster capstan-system/<name>; nil lists are
// left unset.
func cluster(name string, pods, services []any) *unstructured.Unstructured {
	cn := map[string]any{}
	if pods != nil {
		cn["pods"] = map[string]any{"cidrBlocks": pods}
	}
	if services != nil {
		cn["services"] = map[string]any{"cidrBlocks": services}
	}
	return object("cluster.x-k8s.io/v1beta2", "Cluster", "capstan-system", name,
		map[string]any{"spec": map[string]any{"clusterNetwork": cn}})
}

// ipPool is a Metal3 IPPool capstan-system/<name> with the given spec.
func ipPool(name string, spec map[string]any) *unstructured.Unstructured {
	return object("ipam.metal3.io/v1alpha1", "IPPool", "capstan-system", name, map[string]any{"spec": spec})
}

// pools is an IPPool spec for the Cluster edge with the given entries of
// spec.pools (maps, or anything else to test bad input).
func pools(entries ...any) map[string]any {
	return map[string]any{"clusterName": "edge", "prefix": int64(24), "pools": entries}
}

func objs(o ...*unstructured.Unstructured) []*unstructured.Unstructured { return o }

const (
	cm   = "ConfigMap capstan-system/network: "
	cl   = "Cluster capstan-system/edge: "
	pool = "IPPool capstan-system/nodes: "
)

// validationCases pin what Validate reports. Each wanted line must be part
// of exactly one reported line, and nothing else may be reported.
var validationCases = []struct {
	name    string
	objects []*unstructured.Unstructured
	want    []string
}{
	// Good configurations.
	{"a complete network ConfigMap passes", objs(network(goodData())), nil},
	{"defaults fill in pods, services and workload networks", objs(network(with("workloadPlaneCIDRs", "-", "podCIDR", "-", "serviceCIDR", "-"))), nil},
	{"lists may be split by newlines", objs(network(with("workloadPlaneCIDRs", "192.168.20.0/24\n192.168.21.0/24\n"))), nil},
	{"IPv6 single stack passes", objs(network(with("controlPlaneCIDRs", "fd00:10::/64", "workloadPlaneCIDRs", "-", "podCIDR", "fd00:233::/56", "serviceCIDR", "fd00:96::/108"))), nil},
	{"objects other than the three kinds are ignored", objs(
		object("v1", "ConfigMap", "capstan-system", "other", map[string]any{"data": map[string]any{"podCIDR": "nonsense"}}),
		object("apps/v1", "Deployment", "capstan-system", "hello", map[string]any{"spec": "nonsense"}),
		nil,
	), nil},
	{"a Cluster agreeing with the ConfigMap passes", objs(network(goodData()), cluster("edge", []any{"10.233.0.0/16"}, []any{"10.96.0.0/12"})), nil},
	{"a Cluster without clusterNetwork passes", objs(cluster("edge", nil, nil)), nil},
	{"a dual-stack Cluster passes", objs(cluster("edge", []any{"10.233.0.0/16", "fd00:233::/56"}, []any{"10.96.0.0/12", "fd00:96::/108"})), nil},
	{"an IPPool inside a control-plane network passes", objs(network(goodData()),
		ipPool("nodes", pools(map[string]any{"start": "192.168.10.10", "end": "192.168.10.100"}))), nil},
	{"an IPPool given by subnet inside a workload network passes", objs(network(goodData()),
		ipPool("nodes", pools(map[string]any{"subnet": "192.168.21.0/25"}))), nil},
	{"proxies with a complete noProxy pass", objs(network(with(
		"httpProxy", "http://proxy.example:3128",
		"httpsProxy", "https://user:secret@proxy.example",
		"noProxy", "localhost,127.0.0.1,::1,.svc,*.cluster.local,registry.example:5000,[fd00::1]:80,10.0.0.0/8,192.168.10.0/24",
	))), nil},
	{"noProxy * covers everything", objs(network(with("httpProxy", "http://10.0.0.1:3128", "noProxy", "*"))), nil},

	// Overlaps.
	{"pod CIDR overlapping the service CIDR", objs(network(with("podCIDR", "10.96.0.0/16"))), []string{
		"ERROR " + cm + "data.podCIDR: 10.96.0.0/16 overlaps the service CIDR 10.96.0.0/12 (data.serviceCIDR); pods and services need separate ranges",
	}},
	{"pod CIDR overlapping a default service CIDR says it is the default", objs(network(with("podCIDR", "10.100.0.0/16", "serviceCIDR", "-"))), []string{
		"ERROR " + cm + "data.podCIDR: 10.100.0.0/16 overlaps the service CIDR 10.96.0.0/12 (default, data.serviceCIDR unset)",
	}},
	{"default pod CIDR overlapping a control-plane network", objs(network(with("controlPlaneCIDRs", "10.233.5.0/24", "workloadPlaneCIDRs", "-", "podCIDR", "-"))), []string{
		"ERROR " + cm + "data.podCIDR: 10.233.0.0/16 (default) overlaps the control-plane network 10.233.5.0/24 (data.controlPlaneCIDRs[0]); the pod CIDR must be a range no host network uses",
	}},
	{"pod CIDR overlapping a workload network", objs(network(with("podCIDR", "192.168.0.0/16"))), []string{
		"ERROR " + cm + "data.podCIDR: 192.168.0.0/16 overlaps the control-plane network 192.168.10.0/24",
		"ERROR " + cm + "data.podCIDR: 192.168.0.0/16 overlaps the workload-plane network 192.168.20.0/24 (data.workloadPlaneCIDRs[0])",
		"ERROR " + cm + "data.podCIDR: 192.168.0.0/16 overlaps the workload-plane network 192.168.21.0/24 (data.workloadPlaneCIDRs[1])",
	}},
	{"service CIDR overlapping a node network", objs(network(with("serviceCIDR", "192.168.16.0/20"))), []string{
		"ERROR " + cm + "data.serviceCIDR: 192.168.16.0/20 overlaps the workload-plane network 192.168.20.0/24",
		"ERROR " + cm + "data.serviceCIDR: 192.168.16.0/20 overlaps the workload-plane network 192.168.21.0/24",
	}},
	{"a defaulted workload list is not reported twice", objs(network(with("workloadPlaneCIDRs", "-", "serviceCIDR", "192.168.10.0/24"))), []string{
		"ERROR " + cm + "data.serviceCIDR: 192.168.10.0/24 overlaps the control-plane network 192.168.10.0/24",
	}},

	// Syntax.
	{"host bits set", objs(network(with("controlPlaneCIDRs", "192.168.10.1/24"))), []string{
		"ERROR " + cm + "data.controlPlaneCIDRs[0]: 192.168.10.1/24: host bits set; did you mean 192.168.10.0/24?",
	}},
	{"an octet out of range", objs(network(with("podCIDR", "10.300.0.0/16"))), []string{
		`ERROR ` + cm + `data.podCIDR: "10.300.0.0/16" is not a CIDR: "10.300.0.0" is not an IP address`,
	}},
	{"a prefix length too long", objs(network(with("serviceCIDR", "10.96.0.0/33"))), []string{
		`ERROR ` + cm + `data.serviceCIDR: "10.96.0.0/33" is not a CIDR: the prefix length must be a number from 0 to 32 for IPv4`,
	}},
	{"an address without a prefix length", objs(network(with("workloadPlaneCIDRs", "192.168.20.0"))), []string{
		`ERROR ` + cm + `data.workloadPlaneCIDRs[0]: "192.168.20.0" is an address, not a CIDR: add the prefix length, like 192.168.20.0/24`,
	}},
	{"not a CIDR at all", objs(network(with("podCIDR", "pods"))), []string{
		`ERROR ` + cm + `data.podCIDR: "pods" is not a CIDR: expected address/prefix length, like 10.0.0.0/16`,
	}},
	{"an IPv4-mapped IPv6 network", objs(network(with("podCIDR", "::ffff:10.233.0.0/112"))), []string{
		"ERROR " + cm + "data.podCIDR: ::ffff:10.233.0.0/112 is an IPv4-mapped IPv6 network; write it as IPv4: 10.233.0.0/16",
	}},
	{"two pod CIDRs in the ConfigMap", objs(network(with("podCIDR", "10.233.0.0/16,10.234.0.0/16"))), []string{
		"ERROR " + cm + "data.podCIDR: 2 CIDRs given; expected one",
	}},
	{"an unknown key, with a suggestion when only its case differs", objs(network(with("podCidr", "10.233.0.0/16", "dnsDomain", "cluster.local"))), []string{
		"ERROR " + cm + "data.dnsDomain: unknown key; the network ConfigMap knows controlPlaneCIDRs,",
		"ERROR " + cm + "data.podCidr: unknown key (did you mean podCIDR?)",
	}},
	{"a value that is not a string", objs(func() *unstructured.Unstructured {
		o := network(goodData())
		o.Object["data"].(map[string]any)["podCIDR"] = int64(10)
		return o
	}()), []string{
		"ERROR " + cm + "data.podCIDR: expected a string, found a number",
	}},

	// Empty and missing lists.
	{"no control-plane networks", objs(network(with("controlPlaneCIDRs", "-"))), []string{
		"ERROR " + cm + "data.controlPlaneCIDRs: missing: list the networks (CIDRs) that hold the nodes' control-plane addresses",
	}},
	{"an empty control-plane list", objs(network(with("controlPlaneCIDRs", " , "))), []string{
		"ERROR " + cm + "data.controlPlaneCIDRs: empty: list at least one network",
	}},
	{"an empty workload list", objs(network(with("workloadPlaneCIDRs", ""))), []string{
		"ERROR " + cm + "data.workloadPlaneCIDRs: empty: list at least one network (CIDR), or leave the key out to use the control-plane networks",
	}},
	{"an empty pod CIDR, as an unset substitution variable leaves it", objs(network(with("podCIDR", ""))), []string{
		"ERROR " + cm + "data.podCIDR: empty: give one CIDR, or leave the key out to use the default 10.233.0.0/16",
	}},
	{"a ConfigMap without data", objs(networkConfig("network", nil)), []string{
		"ERROR " + cm + "data.controlPlaneCIDRs: missing",
		"WARNING " + cm + "data.sshAuthorizedKeys: missing, so no SSH public key",
	}},

	// IP families.
	{"an IPv6 pod CIDR with an IPv4 service CIDR", objs(network(with("podCIDR", "fd00:233::/56"))), []string{
		"ERROR " + cm + "data.podCIDR: fd00:233::/56 is IPv6 but the service network is IPv4-only (10.96.0.0/12 (data.serviceCIDR)); pods and services need the same IP families",
	}},
	{"an IPv6 node network in an IPv4 cluster", objs(network(with("controlPlaneCIDRs", "192.168.10.0/24, fd00:10::/64"))), []string{
		"ERROR " + cm + "data.controlPlaneCIDRs[1]: fd00:10::/64 is an IPv6 network but the cluster is IPv4-only (service CIDR 10.96.0.0/12 (data.serviceCIDR)); nodes need addresses of the cluster's family",
	}},
	{"dual-stack services with IPv4-only pods", objs(cluster("edge", []any{"10.233.0.0/16"}, []any{"10.96.0.0/12", "fd00:96::/108"})), []string{
		"ERROR " + cl + "spec.clusterNetwork.services.cidrBlocks[1]: fd00:96::/108 is IPv6 but the pod network is IPv4-only",
	}},

	// Clusters.
	{"a Cluster disagreeing with the ConfigMap", objs(network(goodData()), cluster("edge", []any{"192.168.0.0/16"}, []any{"10.96.0.0/12"})), []string{
		"ERROR " + cl + "spec.clusterNetwork.pods.cidrBlocks: [192.168.0.0/16] disagrees with the pod CIDR 10.233.0.0/16 (ConfigMap capstan-system/network data.podCIDR); set both to the same network",
	}},
	{"without a ConfigMap, a Cluster's pods overlapping its default services", objs(cluster("edge", []any{"10.96.0.0/16"}, nil)), []string{
		"ERROR " + cl + "spec.clusterNetwork.pods.cidrBlocks[0]: 10.96.0.0/16 overlaps the service CIDR 10.96.0.0/12 (default, spec.clusterNetwork.services.cidrBlocks unset)",
	}},
	{"a Cluster with two IPv4 pod blocks", objs(cluster("edge", []any{"10.233.0.0/16", "10.234.0.0/16"}, nil)), []string{
		"ERROR " + cl + "spec.clusterNetwork.pods.cidrBlocks: two IPv4 blocks; a dual-stack cluster has one IPv4 and one IPv6 block",
	}},
	{"a Cluster with three service blocks and a bad one", objs(cluster("edge", nil, []any{"10.96.0.0/12", "fd00::/108", "10.97.0.1/16"})), []string{
		"ERROR " + cl + "spec.clusterNetwork.services.cidrBlocks[2]: 10.97.0.1/16: host bits set; did you mean 10.97.0.0/16?",
		"ERROR " + cl + "spec.clusterNetwork.services.cidrBlocks: 3 blocks; expected one, or two of different IP families for dual stack",
	}},
	{"a Cluster whose cidrBlocks is not a list", objs(cluster("edge", nil, nil), func() *unstructured.Unstructured {
		o := cluster("odd", nil, nil)
		o.Object["spec"].(map[string]any)["clusterNetwork"] = map[string]any{"pods": map[string]any{"cidrBlocks": "10.233.0.0/16"}, "services": "x"}
		return o
	}()), []string{
		"ERROR Cluster capstan-system/odd: spec.clusterNetwork.pods.cidrBlocks: expected a list of CIDRs, found the string \"10.233.0.0/16\"",
		"ERROR Cluster capstan-system/odd: spec.clusterNetwork.services.cidrBlocks: cannot be read",
	}},

	// IPPools.
	{"an IPPool outside every node network", objs(network(goodData()),
		ipPool("nodes", pools(map[string]any{"start": "192.168.30.10", "end": "192.168.30.20"}))), []string{
		"ERROR " + pool + "spec.pools[0]: addresses 192.168.30.10-192.168.30.20 are outside every control-plane and workload-plane network of ConfigMap capstan-system/network (192.168.10.0/24, 192.168.20.0/24, 192.168.21.0/24)",
	}},
	{"an IPPool straddling two node networks", objs(network(goodData()),
		ipPool("nodes", pools(map[string]any{"start": "192.168.20.200", "end": "192.168.21.10"}))), []string{
		"ERROR " + pool + "spec.pools[0]: addresses 192.168.20.200-192.168.21.10 are outside every control-plane and workload-plane network",
	}},
	{"an IPPool overlapping the pod CIDR", objs(network(with("controlPlaneCIDRs", "10.0.0.0/8", "workloadPlaneCIDRs", "-", "podCIDR", "172.16.0.0/16", "serviceCIDR", "172.17.0.0/16")),
		ipPool("nodes", pools(map[string]any{"start": "172.16.0.10"}))), []string{
		"ERROR " + pool + "spec.pools[0]: addresses 172.16.0.10-172.16.0.255 are outside every control-plane and workload-plane network",
		"ERROR " + pool + "spec.pools[0]: addresses 172.16.0.10-172.16.0.255 overlap the pod CIDR 172.16.0.0/16 (ConfigMap capstan-system/network data.podCIDR); node addresses must stay out of it",
	}},
	{"without a ConfigMap, an IPPool overlapping its Cluster's default services", objs(cluster("edge", nil, nil),
		ipPool("nodes", pools(map[string]any{"subnet": "10.100.0.0/24"}))), []string{
		"ERROR " + pool + "spec.pools[0]: addresses 10.100.0.0-10.100.0.255 overlap the service CIDR 10.96.0.0/12 (default, Cluster capstan-system/edge spec.clusterNetwork.services.cidrBlocks unset)",
	}},
	{"an IPv6 IPPool in an IPv4 cluster", objs(network(goodData()),
		ipPool("nodes", pools(map[string]any{"start": "fd00::10", "end": "fd00::20"}))), []string{
		"ERROR " + pool + "spec.pools[0]: IPv6 addresses fd00::10-fd00::20, but the cluster is IPv4-only",
	}},
	{"IPPool syntax", objs(network(goodData()), ipPool("nodes", pools(
		map[string]any{"start": "192.168.10.20", "end": "192.168.10.10"},
		map[string]any{"start": "192.168.10.300"},
		map[string]any{"subnet": "192.168.10.0/33"},
		map[string]any{"end": "192.168.10.10"},
		map[string]any{"start": "192.168.10.10", "end": "fd00::1"},
		map[string]any{"start": "192.168.10.10", "subnet": "192.168.20.0/24"},
		map[string]any{"start": "192.168.10.10", "prefix": int64(40)},
		map[string]any{"start": "192.168.10.10", "prefix": "24"},
		"not a map",
	))), []string{
		"ERROR " + pool + "spec.pools[0]: start 192.168.10.20 is after end 192.168.10.10",
		`ERROR ` + pool + `spec.pools[1].start: "192.168.10.300" is not an IP address`,
		`ERROR ` + pool + `spec.pools[2].subnet: "192.168.10.0/33" is not a CIDR`,
		"ERROR " + pool + "spec.pools[3]: neither start nor subnet",
		"ERROR " + pool + "spec.pools[4]: mixes IPv4 and IPv6 addresses",
		"ERROR " + pool + "spec.pools[5]: addresses 192.168.10.10-192.168.20.255 are not all in the pool's subnet 192.168.20.0/24",
		"ERROR " + pool + "spec.pools[6].prefix: 40 is not a prefix length of IPv4 (0 to 32)",
		`ERROR ` + pool + `spec.pools[7].prefix: expected a prefix length (a whole number), found the string "24"`,
		"ERROR " + pool + "spec.pools[8]: expected a map, found the string \"not a map\"",
	}},

	// Proxies.
	{"proxy URLs that do not parse or lack a scheme or host", objs(network(with(
		"httpProxy", "proxy.example:3128",
		"httpsProxy", "ftp://proxy.example",
		"noProxy", "*",
	)), networkConfig("network2", with(
		"httpProxy", "http://user:hunter2@proxy.example:99999",
		"httpsProxy", "http://",
		"noProxy", "*",
	)), networkConfig("network3", with(
		"httpProxy", "http://user:hunter2@proxy.example:port",
		"httpsProxy", "http://bad_host.example",
		"noProxy", "*",
	))), []string{
		"ERROR " + cm + "data.httpProxy: no scheme; expected a URL like http://proxy.example:3128",
		"ERROR " + cm + "data.httpsProxy: ftp://proxy.example: the scheme must be http or https",
		"ERROR ConfigMap capstan-system/network2: metadata.labels: a second network ConfigMap; ConfigMap capstan-system/network already describes the network",
		`ERROR ConfigMap capstan-system/network2: data.httpProxy: http://user:xxxxx@proxy.example:99999: port "99999" must be a number from 1 to 65535`,
		"ERROR ConfigMap capstan-system/network2: data.httpsProxy: http:// has no host",
		"ERROR ConfigMap capstan-system/network3: metadata.labels: a second network ConfigMap",
		`ERROR ConfigMap capstan-system/network3: data.httpProxy: not a URL (invalid port ":port" after host)`,
		`ERROR ConfigMap capstan-system/network3: data.httpsProxy: http://bad_host.example: "bad_host.example" is neither a hostname nor an IP address`,
	}},
	{"a proxy without the cluster's networks in noProxy warns", objs(network(with("httpsProxy", "http://proxy.example:3128", "noProxy", "localhost,.svc,10.233.0.0/17"))), []string{
		"WARNING " + cm + "data.noProxy: does not cover the service CIDR 10.96.0.0/12: with a proxy set, traffic to it goes through the proxy; add 10.96.0.0/12",
		"WARNING " + cm + "data.noProxy: does not cover the pod CIDR 10.233.0.0/16",
		"WARNING " + cm + "data.noProxy: does not cover the control-plane network 192.168.10.0/24",
	}},
	{"noProxy entries that are not hosts, addresses or CIDRs", objs(network(with("noProxy", "localhost, exa mple.com?, 10.0.0.1/8, -bad.example, 10.0.0, host:0, .example.com"))), []string{
		`ERROR ` + cm + `data.noProxy[2]: "mple.com?" is not a hostname, domain suffix`,
		"ERROR " + cm + "data.noProxy[3]: 10.0.0.1/8: host bits set; did you mean 10.0.0.0/8?",
		`ERROR ` + cm + `data.noProxy[4]: "-bad.example" is not a hostname`,
		`ERROR ` + cm + `data.noProxy[5]: "10.0.0" is not a hostname`,
		`ERROR ` + cm + `data.noProxy[6]: "host:0": port "0" must be a number from 1 to 65535`,
	}},

	// SSH keys.
	{"no SSH keys warns", objs(network(with("sshAuthorizedKeys", "-"))), []string{
		"WARNING " + cm + "data.sshAuthorizedKeys: missing, so no SSH public key: nobody will be able to log in to the nodes; add at least one authorized_keys line",
	}},
	{"only comments where the SSH keys go warns", objs(network(with("sshAuthorizedKeys", "# keys come later\n\n"))), []string{
		"WARNING " + cm + "data.sshAuthorizedKeys: no SSH public key",
	}},
	{"a line that is not a key, next to a good one", objs(network(with("sshAuthorizedKeys", sshKey+"\nssh-ed25519 AAAA-truncated\n"))), []string{
		"ERROR " + cm + "data.sshAuthorizedKeys: line 2 is not an authorized_keys line: ssh: no key found",
	}},
	{"a private key where the public one goes", objs(network(with("sshAuthorizedKeys", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"))), []string{
		"ERROR " + cm + "data.sshAuthorizedKeys: holds a private key; put the public key (the .pub file) here",
	}},

	// Everything at once.
	{"every problem is reported at once, grouped by object", objs(
		ipPool("nodes", pools(map[string]any{"start": "10.96.0.10", "end": "10.96.0.20"})),
		network(map[string]string{
			"controlPlaneCIDRs": "10.96.0.0/24, 10.0.0.1/8",
			"podCIDR":           "10.96.0.0/16",
			"httpProxy":         "socks5://proxy:1080",
		}),
	), []string{
		"ERROR " + pool + "spec.pools[0]: addresses 10.96.0.10-10.96.0.20 overlap the pod CIDR 10.96.0.0/16",
		"ERROR " + pool + "spec.pools[0]: addresses 10.96.0.10-10.96.0.20 overlap the service CIDR 10.96.0.0/12 (default",
		"ERROR " + cm + "data.controlPlaneCIDRs[1]: 10.0.0.1/8: host bits set; did you mean 10.0.0.0/8?",
		"ERROR " + cm + "data.podCIDR: 10.96.0.0/16 overlaps the service CIDR 10.96.0.0/12 (default, data.serviceCIDR unset)",
		"ERROR " + cm + "data.podCIDR: 10.96.0.0/16 overlaps the control-plane network 10.96.0.0/24 (data.controlPlaneCIDRs[0])",
		"ERROR " + cm + "data.serviceCIDR: 10.96.0.0/12 (default) overlaps the control-plane network 10.96.0.0/24 (data.controlPlaneCIDRs[0])",
		"ERROR " + cm + "data.httpProxy: socks5://proxy:1080: the scheme must be http or https",
		"WARNING " + cm + "data.noProxy: does not cover the service CIDR 10.96.0.0/12 (default)",
		"WARNING " + cm + "data.noProxy: does not cover the pod CIDR 10.96.0.0/16",
		"WARNING " + cm + "data.noProxy: does not cover the control-plane network 10.96.0.0/24",
		"WARNING " + cm + "data.sshAuthorizedKeys: missing",
	}},
}

func TestValidate(t *testing.T) {
	for _, tc := range validationCases {
		t.Run(tc.name, func(t *testing.T) {
			report := preflight.Validate(tc.objects)
			var got []string
			for _, p := range report.Problems {
				got = append(got, p.Line())
			}
			matched := make([]bool, len(got))
			for _, want := range tc.want {
				n := 0
				for i, line := range got {
					if strings.Contains(line, want) {
						n++
						matched[i] = true
					}
				}
				if n != 1 {
					t.Errorf("%d problems contain %q, want 1", n, want)
				}
			}
			for i, line := range got {
				if !matched[i] {
					t.Errorf("unexpected problem: %s", line)
				}
			}
			if t.Failed() {
				t.Logf("report:\n%s", report.Lines())
			}
		})
	}
}

// The order of the wanted lines is the order of the report: by object,
// then by key.
func TestValidateReportsInObjectOrder(t *testing.T) {
	for _, tc := range validationCases {
		t.Run(tc.name, func(t *testing.T) {
			report := preflight.Validate(tc.objects)
			next := 0
			for _, p := range report.Problems {
				if next < len(tc.want) && strings.Contains(p.Line(), tc.want[next]) {
					next++
				}
			}
			if next != len(tc.want) {
				t.Errorf("problems out of order; the first not found in order is %q:\n%s", tc.want[next], report.Lines())
			}
		})
	}
}

func TestValidateAppliesDefaults(t *testing.T) {
	report := preflight.Validate(objs(network(with("workloadPlaneCIDRs", "-", "podCIDR", "-", "serviceCIDR", "-"))))
	want := preflight.Network{
		Object:             "ConfigMap capstan-system/network",
		ControlPlaneCIDRs:  []string{"192.168.10.0/24"},
		WorkloadPlaneCIDRs: []string{"192.168.10.0/24"},
		PodCIDRs:           []string{preflight.DefaultPodCIDR},
		ServiceCIDRs:       []string{preflight.DefaultServiceCIDR},
	}
	if len(report.Networks) != 1 || !equalNetwork(report.Networks[0], want) {
		t.Errorf("networks = %+v, want %+v", report.Networks, want)
	}

	report = preflight.Validate(objs(cluster("edge", []any{"192.168.0.0/16"}, nil)))
	want = preflight.Network{
		Object:       "Cluster capstan-system/edge",
		PodCIDRs:     []string{"192.168.0.0/16"},
		ServiceCIDRs: []string{preflight.DefaultServiceCIDR},
	}
	if len(report.Networks) != 1 || !equalNetwork(report.Networks[0], want) {
		t.Errorf("networks = %+v, want %+v", report.Networks, want)
	}
}

func equalNetwork(a, b preflight.Network) bool {
	return a.Object == b.Object && slices.Equal(a.ControlPlaneCIDRs, b.ControlPlaneCIDRs) &&
		slices.Equal(a.WorkloadPlaneCIDRs, b.WorkloadPlaneCIDRs) && slices.Equal(a.PodCIDRs, b.PodCIDRs) &&
		slices.Equal(a.ServiceCIDRs, b.ServiceCIDRs)
}

func TestReportErrFailsOnErrorsOnly(t *testing.T) {
	warnings := preflight.Validate(objs(network(with("httpProxy", "http://proxy.example:3128"))))
	if len(warnings.Warnings()) == 0 || len(warnings.Errors()) != 0 {
		t.Fatalf("want only warnings, got:\n%s", warnings.Lines())
	}
	if err := warnings.Err(); err != nil {
		t.Errorf("Err() = %v, want nil: warnings pass", err)
	}

	bad := preflight.Validate(objs(network(with("podCIDR", "10.96.0.0/16", "serviceCIDR", "10.96.0.1/12"))))
	err := bad.Err()
	if err == nil {
		t.Fatal("Err() = nil, want the errors")
	}
	if lines := strings.Split(err.Error(), "\n"); len(lines) != len(bad.Errors()) {
		t.Errorf("Err() has %d lines for %d errors:\n%v", len(lines), len(bad.Errors()), err)
	}
	var p preflight.Problem
	if !errors.As(err, &p) || p.Object != "ConfigMap capstan-system/network" || p.Field == "" {
		t.Errorf("errors.As(Err(), *Problem) = %+v", p)
	}
	if got := bad.Summary(); got != "1 error, 0 warnings" {
		t.Errorf("Summary() = %q", got)
	}
}

func TestValidateNeverReportsProxyPasswords(t *testing.T) {
	for _, proxy := range []string{
		"http://user:hunter2@proxy.example:99999",
		"http://user:hunter2@proxy.example:port",
		"user:hunter2@proxy.example:3128",
		"ftp://user:hunter2@proxy.example",
		"http://user:hunter2@bad_host",
		"http://user:hunter2@[::1",
	} {
		report := preflight.Validate(objs(network(with("httpProxy", proxy, "noProxy", "*"))))
		if len(report.Problems) == 0 {
			t.Errorf("%s: no problem reported", proxy)
		}
		if strings.Contains(report.Lines(), "hunter2") {
			t.Errorf("%s: the report shows the password:\n%s", proxy, report.Lines())
		}
	}
}

func TestValidateNamesTheObjectsItChecked(t *testing.T) {
	unlabelled := object("v1", "ConfigMap", "capstan-system", "network-settings", map[string]any{"data": map[string]any{"podCIDR": "10.233.0.0/16"}})
	report := preflight.Validate(objs(
		unlabelled,
		network(goodData()),
		cluster("edge", nil, nil),
		object("apps/v1", "Deployment", "capstan-system", "hello", nil),
		ipPool("nodes", pools()),
		network(goodData()), // the same object twice counts once
	))
	want := []string{"ConfigMap capstan-system/network", "Cluster capstan-system/edge", "IPPool capstan-system/nodes"}
	if !slices.Equal(report.Checked, want) {
		t.Errorf("Checked = %q, want %q", report.Checked, want)
	}
	if empty := preflight.Validate(nil); empty.Checked == nil || empty.Problems == nil {
		t.Errorf("Validate(nil) = %+v, want empty lists, not nil ones, for JSON", empty)
	}
}
