package preflight

import (
	"strings"

	"golang.org/x/crypto/ssh"
)

// checkSSHKeys checks the SSH public keys of the network ConfigMap. A
// line that is not an authorized_keys line is an error: it is a typo or a
// truncated paste that would lock the operator out. No key at all is a
// warning: Metal3 provisions and joins nodes without SSH, so the cluster
// builds, but nobody can log in to a node to debug it, and an installer
// that joins nodes over SSH (seed 004) cannot.
func (v *validation) checkSSHKeys(c *networkConfig) {
	field := "data." + KeySSHAuthorizedKeys
	const noKey = "no SSH public key: nobody will be able to log in to the nodes; add at least one authorized_keys line"
	s, set := c.values[KeySSHAuthorizedKeys]
	if !set {
		v.warnf(c.object, field, "missing, so %s", noKey)
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
	if keys == 0 && bad == 0 {
		v.warnf(c.object, field, "%s", noKey)
	}
}
