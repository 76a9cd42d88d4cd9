package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"slices"
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
// user did not set it: the daemon always does, so render, validate and
// diff must not report it unset. The value is a fresh public key whose
// private half is thrown away, so that nothing applied from the CLI's
// output opens a node to anyone.
func bootstrapKeyPlaceholder(spec *capstanv1.ClusterDeploymentSpec) error {
	specs, err := stages.StageSpecs(*spec)
	if err != nil || !slices.ContainsFunc(specs, func(s capstanv1.StageSpec) bool { return s.BootstrapKey != nil }) {
		return nil // a bad plan is reported where it is built
	}
	if _, set := spec.Substitute[stages.BootstrapKeyVar]; set {
		return nil
	}
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("make a placeholder bootstrap key: %w", err)
	}
	key, err := ssh.NewPublicKey(pub)
	if err != nil {
		return fmt.Errorf("make a placeholder bootstrap key: %w", err)
	}
	if spec.Substitute == nil {
		spec.Substitute = map[string]string{}
	}
	spec.Substitute[stages.BootstrapKeyVar] = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key))) + " " + placeholderComment
	return nil
}
