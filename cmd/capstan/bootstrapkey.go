package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"maps"
	"strings"

	"golang.org/x/crypto/ssh"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// placeholderComment marks the public key the CLI puts where the daemon
// puts the bootstrap key it generates.
const placeholderComment = "capstan-bootstrap-key-placeholder"

// bootstrapKeyPlaceholder gives ${CAPSTAN_BOOTSTRAP_SSH_KEY} a value when
// the deployment's plan hands the bootstrap key to the cluster and the
// user did not set it: the daemon always does, so render and validate
// must not report it unset. (diff, which has a cluster, reads the
// daemon's key first: diff_daemon.go.)
func bootstrapKeyPlaceholder(spec *capstanv1.ClusterDeploymentSpec) error {
	if !stages.NeedsBootstrapKey(*spec) {
		return nil
	}
	if _, set := spec.Substitute[stages.BootstrapKeyVar]; set {
		return nil
	}
	key, err := placeholderKey()
	if err != nil {
		return err
	}
	setSubstitute(spec, stages.BootstrapKeyVar, key)
	return nil
}

// placeholderKey is a fresh public key whose private half is thrown away,
// so that nothing applied from the CLI's output opens a node to anyone.
func placeholderKey() (string, error) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", fmt.Errorf("make a placeholder bootstrap key: %w", err)
	}
	key, err := ssh.NewPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("make a placeholder bootstrap key: %w", err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key))) + " " + placeholderComment, nil
}

// setSubstitute sets ${name} of spec to value, in a map of its own: the
// spec may share its map with a deployment read from a file or cluster.
func setSubstitute(spec *capstanv1.ClusterDeploymentSpec, name, value string) {
	subst := maps.Clone(spec.Substitute)
	if subst == nil {
		subst = map[string]string{}
	}
	subst[name] = value
	spec.Substitute = subst
}
