package git

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"github.com/skeema/knownhosts"
	"golang.org/x/crypto/ssh"

	"github.com/capstan-dev/capstan/sources"
)

// authMethod turns Auth into what go-git needs for ep's scheme: basic auth
// for http(s), a key with a known_hosts check for ssh, nothing for git://
// and file://.
func authMethod(ep *transport.Endpoint, a Auth, from CredentialsFrom) (transport.AuthMethod, error) {
	switch ep.Protocol {
	case "http", "https":
		if a.Username == "" && a.Password == "" {
			return nil, nil
		}
		user := a.Username
		if user == "" {
			user = "git"
		}
		return &githttp.BasicAuth{Username: user, Password: a.Password}, nil
	case "ssh":
		return sshAuth(ep, a, from)
	default:
		return nil, nil
	}
}

// sshAuth builds public key auth whose host key check is the known_hosts
// given in a, never the machine's ~/.ssh and never "accept anything".
func sshAuth(ep *transport.Endpoint, a Auth, from CredentialsFrom) (transport.AuthMethod, error) {
	if len(a.SSHPrivateKey) == 0 {
		return nil, fmt.Errorf("%w: an ssh URL needs a private key: set %s", sources.ErrInvalid, from.SSHKey)
	}
	if len(a.SSHKnownHosts) == 0 {
		return nil, fmt.Errorf("%w: an ssh URL needs the server's host key: set %s (ssh-keyscan prints it)",
			sources.ErrInvalid, from.KnownHosts)
	}
	signer, err := ssh.ParsePrivateKey(a.SSHPrivateKey)
	if err != nil {
		var missing *ssh.PassphraseMissingError
		if errors.As(err, &missing) {
			return nil, fmt.Errorf("%w: the ssh private key is encrypted; use an unencrypted deploy key", sources.ErrInvalid)
		}
		// The parser's message never includes key material.
		return nil, fmt.Errorf("%w: parse ssh private key: %w", sources.ErrInvalid, err)
	}
	db, err := knownHostsDB(a.SSHKnownHosts)
	if err != nil {
		return nil, fmt.Errorf("%w: parse known_hosts: %w", sources.ErrInvalid, err)
	}
	port := ep.Port
	if port == 0 {
		port = 22
	}
	hostWithPort := net.JoinHostPort(ep.Host, strconv.Itoa(port))
	if len(db.HostKeys(hostWithPort)) == 0 {
		return nil, fmt.Errorf("%w: known_hosts has no key for %s; add the line ssh-keyscan -p %d %s prints",
			sources.ErrInvalid, knownhosts.Normalize(hostWithPort), port, ep.Host)
	}
	user := a.SSHUser
	if user == "" {
		user = ep.User
	}
	if user == "" {
		user = "git"
	}
	return &sshKeyAuth{PublicKeys: &gitssh.PublicKeys{
		User:   user,
		Signer: signer,
		HostKeyCallbackHelper: gitssh.HostKeyCallbackHelper{
			HostKeyCallback: db.HostKeyCallback(),
			// Offer only the algorithms known_hosts has keys for, or a
			// server that prefers another key type fails the check.
			HostKeyAlgorithms: db.HostKeyAlgorithms(hostWithPort),
		},
	}}, nil
}

// sshDialTimeout bounds connecting to an ssh server. go-git dials ssh
// without the caller's context, so without it an unreachable host would
// hold a poll until the kernel gives up.
const sshDialTimeout = 30 * time.Second

// sshKeyAuth is public key auth with a dial timeout.
type sshKeyAuth struct {
	*gitssh.PublicKeys
}

// ClientConfig implements gitssh.AuthMethod.
func (a *sshKeyAuth) ClientConfig() (*ssh.ClientConfig, error) {
	cfg, err := a.PublicKeys.ClientConfig()
	if err != nil {
		return nil, err
	}
	cfg.Timeout = sshDialTimeout
	return cfg, nil
}

// knownHostsDB parses known_hosts content. The parser only reads files, so
// the content goes through a private temporary file that is removed at
// once; nothing keeps reading it afterwards.
func knownHostsDB(content []byte) (*knownhosts.HostKeyDB, error) {
	f, err := os.CreateTemp("", "capstan-known-hosts-")
	if err != nil {
		return nil, fmt.Errorf("write temporary known_hosts: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(content); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("write temporary known_hosts: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("write temporary known_hosts: %w", err)
	}
	return knownhosts.NewDB(f.Name())
}
