package git

import (
	"github.com/capstan-dev/capstan/sources"
)

// The keys of a credentials Secret that AuthFromSecret reads, the same
// as Flux's GitRepository secretRef.
const (
	SecretKeyUsername   = "username"
	SecretKeyPassword   = "password"
	SecretKeyIdentity   = "identity"
	SecretKeyKnownHosts = "known_hosts"
)

// AuthFromSecret reads git credentials from the data of a Secret that a
// deployment's secretRef names: username and password (or a token) for
// https, identity and known_hosts for ssh, and ca.crt (or the older
// caFile) with the CAs to trust for https beside the system roots. It is
// the one reader of these keys for git sources, pull request heads and
// status commits. Its error names the key (never its value); the caller
// adds which Secret.
func AuthFromSecret(data map[string][]byte) (Auth, error) {
	ca, err := sources.CABundle(data)
	if err != nil {
		return Auth{}, err
	}
	return Auth{
		Username:      string(data[SecretKeyUsername]),
		Password:      string(data[SecretKeyPassword]),
		SSHPrivateKey: data[SecretKeyIdentity],
		SSHKnownHosts: data[SecretKeyKnownHosts],
		CABundle:      ca,
	}, nil
}
