package stages

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages/pivot"
)

const (
	// BootstrapKeySecret holds Capstan's bootstrap SSH key in a
	// deployment's namespace. It is generated once and never rewritten.
	BootstrapKeySecret = pivot.BootstrapKeySecret
	// BootstrapKeyVar is the substitution variable that carries the
	// bootstrap key's public half into the overlay.
	BootstrapKeyVar = "CAPSTAN_BOOTSTRAP_SSH_KEY"
	// BootstrapKeyCopyPrefix names a cluster's copy of the key:
	// bootstrap-key-<cluster>.
	BootstrapKeyCopyPrefix = "bootstrap-key-"
)

// NeedsBootstrapKey reports whether the plan of spec has a stage that
// hands the bootstrap key to the cluster (bootstrapKey, as profile
// bootstrap's ClusterSSHConfigured): its render needs ${BootstrapKeyVar}.
// A plan that does not build needs nothing; it is reported where it is
// built.
func NeedsBootstrapKey(spec capstanv1.ClusterDeploymentSpec) bool {
	specs, err := StageSpecs(spec)
	return err == nil && slices.ContainsFunc(specs, func(s capstanv1.StageSpec) bool { return s.BootstrapKey != nil })
}

// EnsureBootstrapKey returns the public half (an authorized_keys line) of
// the bootstrap SSH key of namespace, generating the key (ed25519) the
// first time. The private half stays in the Secret: it is never returned,
// logged or written anywhere else but a cluster's copy.
func (e *Executor) EnsureBootstrapKey(ctx context.Context, namespace string) (string, error) {
	public, found, err := ReadBootstrapKey(ctx, e.home, namespace)
	if found || err != nil {
		return public, err
	}
	secret, err := newBootstrapKey(namespace)
	if err != nil {
		return "", err
	}
	if err = e.home.Create(ctx, secret); apierrors.IsAlreadyExists(err) {
		// Another daemon made it first; use theirs.
		public, _, err = ReadBootstrapKey(ctx, e.home, namespace)
		return public, err
	}
	if err != nil {
		return "", fmt.Errorf("bootstrap key Secret %s/%s: %w", namespace, BootstrapKeySecret, err)
	}
	return bootstrapPublicKey(secret)
}

// ReadBootstrapKey returns the public half of the bootstrap SSH key of
// namespace, found false when its Secret does not exist yet (the daemon
// creates it on the first reconcile that needs it). It only reads: the
// CLI's previews use it to render as the daemon would. The Secret, private
// half included, stays inside this function; only the public half leaves.
func ReadBootstrapKey(ctx context.Context, c client.Reader, namespace string) (public string, found bool, err error) {
	secret := &corev1.Secret{}
	err = c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: BootstrapKeySecret}, secret)
	switch {
	case apierrors.IsNotFound(err):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("read bootstrap key Secret %s/%s: %w", namespace, BootstrapKeySecret, err)
	}
	public, err = bootstrapPublicKey(secret)
	return public, true, err
}

// bootstrapPublicKey is the public half of a bootstrap key Secret, checked
// to be an SSH public key. A bad one stalls: a retry reads the same.
func bootstrapPublicKey(secret *corev1.Secret) (string, error) {
	public := strings.TrimSpace(string(secret.Data[bootstrapPublicKeyField]))
	if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(public)); err != nil {
		return "", Stalled(fmt.Errorf("bootstrap key Secret %s/%s: data.%s is not an SSH public key (%v); delete the Secret to have a new key generated",
			secret.Namespace, secret.Name, bootstrapPublicKeyField, err))
	}
	return public, nil
}

// bootstrapPublicKeyField holds the public half in the key's Secrets.
const bootstrapPublicKeyField = "ssh-publickey"

func newBootstrapKey(namespace string) (*corev1.Secret, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate the bootstrap key: %w", err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "capstan-bootstrap")
	if err != nil {
		return nil, fmt.Errorf("encode the bootstrap key: %w", err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("encode the bootstrap key: %w", err)
	}
	public := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub))) + " capstan-bootstrap"
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: BootstrapKeySecret, Namespace: namespace,
			Labels: map[string]string{OwnerGroup + "/component": "bootstrap-key"}},
		Type: corev1.SecretTypeSSHAuth,
		Data: map[string][]byte{
			corev1.SSHAuthPrivateKey: pem.EncodeToMemory(block),
			bootstrapPublicKeyField:  []byte(public + "\n"),
		},
	}, nil
}

// copyBootstrapKey applies the cluster's copy of the bootstrap key,
// bootstrap-key-<cluster>, which moves with the cluster's objects so that
// the cluster can reach its machines' agents once it manages itself.
func (e *Executor) copyBootstrapKey(ctx context.Context, stage *Stage, owner Owner) error {
	spec := stage.BootstrapKey
	cluster, namespace := spec.ClusterName, spec.Namespace
	if cluster == "" {
		cluster = owner.Name
	}
	if namespace == "" {
		namespace = owner.Namespace
	}
	key := &corev1.Secret{}
	if err := e.home.Get(ctx, client.ObjectKey{Namespace: owner.Namespace, Name: BootstrapKeySecret}, key); err != nil {
		return fmt.Errorf("stage %s: read the bootstrap key: %w", stage.Name, err)
	}
	copied := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "Secret",
		"metadata": map[string]any{
			"name":      BootstrapKeyCopyPrefix + cluster,
			"namespace": namespace,
			"labels":    map[string]any{OwnerGroup + "/component": "bootstrap-key", "cluster.x-k8s.io/cluster-name": cluster},
		},
		"type": string(corev1.SecretTypeSSHAuth),
		"data": map[string]any{
			corev1.SSHAuthPrivateKey: base64.StdEncoding.EncodeToString(key.Data[corev1.SSHAuthPrivateKey]),
			bootstrapPublicKeyField:  base64.StdEncoding.EncodeToString(key.Data[bootstrapPublicKeyField]),
		},
	}}
	if _, err := e.Apply(ctx, []*unstructured.Unstructured{copied}, stage.Name, owner); err != nil {
		return fmt.Errorf("stage %s: copy the bootstrap key to Secret %s/%s: %w", stage.Name, namespace, copied.GetName(), err)
	}
	return nil
}
