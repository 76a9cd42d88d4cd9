package preflight

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// ConfigLabel, set to NetworkConfig, marks the ConfigMap that holds a
// cluster's network settings.
const (
	ConfigLabel   = "capstan.dev/config"
	NetworkConfig = "network"
)

// The keys of the network ConfigMap. Lists are written with commas, spaces
// or newlines between their entries.
const (
	// KeyControlPlaneCIDRs lists the networks that hold the nodes'
	// control-plane addresses (etcd, kube-apiserver, kubelet). Required.
	KeyControlPlaneCIDRs = "controlPlaneCIDRs"
	// KeyWorkloadPlaneCIDRs lists the networks the pod overlay routes
	// over. Defaults to the control-plane networks.
	KeyWorkloadPlaneCIDRs = "workloadPlaneCIDRs"
	// KeyPodCIDR is the pod overlay network. Defaults to DefaultPodCIDR.
	KeyPodCIDR = "podCIDR"
	// KeyServiceCIDR is the service network. Defaults to
	// DefaultServiceCIDR.
	KeyServiceCIDR = "serviceCIDR"
	// KeyHTTPProxy and KeyHTTPSProxy are the proxy URLs the nodes use,
	// if any.
	KeyHTTPProxy  = "httpProxy"
	KeyHTTPSProxy = "httpsProxy"
	// KeyNoProxy lists the destinations reached without the proxy:
	// hostnames, domain suffixes, IP addresses and CIDRs.
	KeyNoProxy = "noProxy"
	// KeySSHAuthorizedKeys holds authorized_keys lines for the nodes.
	// Without a key, validation warns.
	KeySSHAuthorizedKeys = "sshAuthorizedKeys"
)

// The defaults of the pod and service networks.
const (
	DefaultPodCIDR     = "10.233.0.0/16"
	DefaultServiceCIDR = "10.96.0.0/12"
)

var knownKeys = []string{
	KeyControlPlaneCIDRs, KeyWorkloadPlaneCIDRs, KeyPodCIDR, KeyServiceCIDR,
	KeyHTTPProxy, KeyHTTPSProxy, KeyNoProxy, KeySSHAuthorizedKeys,
}

// Roles of networks, as messages name them.
const (
	roleControlPlane = "control-plane network"
	roleWorkload     = "workload-plane network"
	rolePod          = "pod CIDR"
	roleService      = "service CIDR"
)

// networkConfig is a network ConfigMap: the network it describes and its
// string values by key.
type networkConfig struct {
	network
	values map[string]string
}

func isNetworkConfig(obj *unstructured.Unstructured) bool {
	gvk := obj.GroupVersionKind()
	return gvk.Group == "" && gvk.Kind == "ConfigMap" && obj.GetLabels()[ConfigLabel] == NetworkConfig
}

func (v *validation) readConfigMap(obj *unstructured.Unstructured) *networkConfig {
	c := &networkConfig{network: network{object: objectRef(obj)}, values: map[string]string{}}
	data, isMap := obj.Object["data"].(map[string]any)
	if obj.Object["data"] != nil && !isMap {
		v.errorf(c.object, "data", "expected a map of strings, found %s", describe(obj.Object["data"]))
	}
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s, ok := data[k].(string)
		switch {
		case !slices.Contains(knownKeys, k):
			v.errorf(c.object, "data."+k, "unknown key%s; the network ConfigMap knows %s", suggest(k), strings.Join(knownKeys, ", "))
		case !ok:
			v.errorf(c.object, "data."+k, "expected a string, found %s", describe(data[k]))
		default:
			c.values[k] = s
		}
	}

	c.controlPlane = v.cidrList(c, KeyControlPlaneCIDRs, roleControlPlane)
	if _, set := c.values[KeyWorkloadPlaneCIDRs]; set {
		c.workload = v.cidrList(c, KeyWorkloadPlaneCIDRs, roleWorkload)
	} else {
		for _, cp := range c.controlPlane {
			c.workload = append(c.workload, cidr{prefix: cp.prefix, object: c.object, field: "data." + KeyWorkloadPlaneCIDRs, defaulted: true, role: roleWorkload})
		}
	}
	c.pods = v.singleCIDR(c, KeyPodCIDR, DefaultPodCIDR, rolePod)
	c.services = v.singleCIDR(c, KeyServiceCIDR, DefaultServiceCIDR, roleService)
	return c
}

// cidrList parses a required list of networks.
func (v *validation) cidrList(c *networkConfig, key, role string) []cidr {
	field := "data." + key
	s, set := c.values[key]
	entries := splitList(s)
	switch {
	case !set && key == KeyControlPlaneCIDRs:
		v.errorf(c.object, field, "missing: list the networks (CIDRs) that hold the nodes' control-plane addresses, where etcd, kube-apiserver and kubelet listen")
		return nil
	case len(entries) == 0 && key == KeyControlPlaneCIDRs:
		v.errorf(c.object, field, "empty: list at least one network (CIDR) that holds the nodes' control-plane addresses")
		return nil
	case len(entries) == 0:
		v.errorf(c.object, field, "empty: list at least one network (CIDR), or leave the key out to use the control-plane networks")
		return nil
	}
	var out []cidr
	for i, e := range entries {
		f := fmt.Sprintf("%s[%d]", field, i)
		p, err := parseCIDR(e)
		if err != nil {
			v.errorf(c.object, f, "%v", err)
			continue
		}
		out = append(out, cidr{prefix: p, object: c.object, field: f, role: role})
	}
	return out
}

// singleCIDR parses a network that has a default.
func (v *validation) singleCIDR(c *networkConfig, key, def, role string) []cidr {
	field := "data." + key
	s, set := c.values[key]
	if !set {
		return []cidr{{prefix: netip.MustParsePrefix(def), object: c.object, field: field, defaulted: true, role: role}}
	}
	entries := splitList(s)
	switch len(entries) {
	case 0:
		v.errorf(c.object, field, "empty: give one CIDR, or leave the key out to use the default %s", def)
		return nil
	case 1:
	default:
		v.errorf(c.object, field, "%d CIDRs given; expected one", len(entries))
		return nil
	}
	p, err := parseCIDR(entries[0])
	if err != nil {
		v.errorf(c.object, field, "%v", err)
		return nil
	}
	return []cidr{{prefix: p, object: c.object, field: field, role: role}}
}

// suggest proposes the known key a misspelt one stands for, when only
// its case differs.
func suggest(key string) string {
	for _, k := range knownKeys {
		if strings.EqualFold(k, key) {
			return fmt.Sprintf(" (did you mean %s?)", k)
		}
	}
	return ""
}

// describe names the type of a decoded YAML value for a message.
func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case int, int32, int64, float32, float64:
		return "a number"
	case string:
		return fmt.Sprintf("the string %q", v)
	case []any:
		return "a list"
	case map[string]any:
		return "a map"
	default:
		return fmt.Sprintf("%T", v)
	}
}
