package git

import (
	"fmt"

	"github.com/go-git/go-git/v5/plumbing/transport"
)

// TransportAuth checks url as New does and returns what go-git needs to
// reach it with a (basic auth for http(s); a key whose host key check is
// a's known_hosts for ssh; nil when nothing is needed), with the URL
// without user info for messages. It is for code that writes to the
// remotes Sources read (reconciler/report pushes status commits), so that
// both authenticate alike. Its errors never quote a password.
func TransportAuth(url string, a Auth) (transport.AuthMethod, string, error) {
	ep, display, err := parseURL(url)
	if err != nil {
		return nil, "", err
	}
	m, err := authMethod(ep, a, CredentialsFrom{}.withDefaults())
	if err != nil {
		return nil, "", fmt.Errorf("git remote %s: %w", display, err)
	}
	return m, display, nil
}
