package preflight

import (
	"strings"

	"golang.org/x/crypto/ssh"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// checkSSHKeys checks the SSH public keys of the network ConfigMap. A
// line that is not an authorized_keys line is an error: it is a typo or a
// truncated paste that would lock the operator out. No key at all is a
// warning: Metal3 provisions and joins nodes without SSH, so the cluster
// builds, but nobody can log in to a node to debug it, and an installer
// that joins nodes over SSH (seed 004) cannot. Keys that a
// KubeadmControlPlane's or KubeadmConfigTemplate's users carry
// (kubeadmConfigSpec.users[].sshAuthorizedKeys) count: no warning then.
func (v *validation) checkSSHKeys(c *networkConfig) {
	field := "data." + KeySSHAuthorizedKeys
	const noKey = "no SSH public key: nobody will be able to log in to the nodes; add at least one authorized_keys line"
	s, set := c.values[KeySSHAuthorizedKeys]
	if !set {
		if !v.userKeys {
			v.warnf(c.object, field, "missing, so %s", noKey)
		}
		return
	}
	if strings.Contains(s, "PRIVATE KEY") {
		v.errorf(c.object, field, "holds a private key; put the public key (the .pub file) here, and keep the private key out of the repository")
		return
	}
	keys, bad := 0, 0
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line)); err != nil {
			v.errorf(c.object, field, "line %d is not an authorized_keys line: %v", i+1, err)
			bad++
			continue
		}
		keys++
	}
	if keys == 0 && bad == 0 && !v.userKeys {
		v.warnf(c.object, field, "%s", noKey)
	}
}

// carriesUserKeys reports whether obj is a KubeadmControlPlane or a
// KubeadmConfigTemplate whose kubeadm users carry at least one SSH key.
func carriesUserKeys(obj *unstructured.Unstructured) bool {
	var path []string
	switch gvk := obj.GroupVersionKind(); {
	case gvk.Group == "controlplane.cluster.x-k8s.io" && gvk.Kind == "KubeadmControlPlane":
		path = []string{"spec", "kubeadmConfigSpec", "users"}
	case gvk.Group == "bootstrap.cluster.x-k8s.io" && gvk.Kind == "KubeadmConfigTemplate":
		path = []string{"spec", "template", "spec", "users"}
	default:
		return false
	}
	users, _, _ := unstructured.NestedSlice(obj.Object, path...)
	for _, u := range users {
		user, _ := u.(map[string]any)
		keys, _ := user["sshAuthorizedKeys"].([]any)
		for _, k := range keys {
			if s, _ := k.(string); strings.TrimSpace(s) != "" {
				return true
			}
		}
	}
	return false
}
