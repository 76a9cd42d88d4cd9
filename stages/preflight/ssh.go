package preflight

import (
	"strings"

	"golang.org/x/crypto/ssh"
)

// checkSSHKeys checks that the network ConfigMap carries at least one SSH
// public key and that every line of it is an authorized_keys line:
// nodes are reached over SSH to join them, and a key that does not parse
// locks the operator out as surely as no key.
func (v *validation) checkSSHKeys(c *networkConfig) {
	field := "data." + KeySSHAuthorizedKeys
	s, set := c.values[KeySSHAuthorizedKeys]
	if !set {
		v.errorf(c.object, field, "missing: give at least one SSH public key (an authorized_keys line); nodes are reached over SSH")
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
		v.errorf(c.object, field, "no SSH public key; give at least one authorized_keys line, nodes are reached over SSH")
	}
}
