package reconciler

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/sources"
	"github.com/capstan-dev/capstan/sources/oci"
)

// readSecret reads the Secret a source's secretRef names, from the
// deployment's namespace.
// It is read from the API at most once per secretTTL.
func (r *Reconciler) readSecret(ctx context.Context, cd *capstanv1.ClusterDeployment, field, name string) (*corev1.Secret, error) {
	key := client.ObjectKey{Namespace: cd.Namespace, Name: name}
	if s, ok := r.sources.cachedSecret(key); ok {
		return s, nil
	}
	secret := &corev1.Secret{}
	if err := r.client.Get(ctx, key, secret); err != nil {
		// Retried: creating the Secret, or granting its read, heals it.
		return nil, failure.Retryable(ReasonSecretNotReadable, fmt.Errorf("%s: read Secret %s/%s: %w", field, cd.Namespace, name, err))
	}
	r.sources.keepSecret(secret)
	return secret, nil
}

// Keys of a Secret that may hold a docker config, in the order they are
// tried: the one of a kubernetes.io/dockerconfigjson Secret, then a file
// name people use with kubectl create secret generic --from-file.
var dockerConfigKeys = []string{corev1.DockerConfigJsonKey, "config.json"}

// ociAuthFromSecret reads a registry's credentials from the Secret a
// deployment's spec.source.oci.secretRef names: a docker config, a CA
// bundle (ca.crt) to trust beside the system roots, or both.
func ociAuthFromSecret(secret *corev1.Secret) (oci.Auth, error) {
	var auth oci.Auth
	for _, k := range dockerConfigKeys {
		if data := secret.Data[k]; len(data) > 0 {
			auth.DockerConfig = data
			break
		}
	}
	ca, err := sources.CABundle(secret.Data)
	if err != nil {
		return oci.Auth{}, err
	}
	if auth.DockerConfig == nil && ca == nil {
		return oci.Auth{}, fmt.Errorf("it has no %s key (create it with kubectl create secret docker-registry) and no %s key (the registry's CA)",
			strings.Join(dockerConfigKeys, " or "), sources.CAKey)
	}
	auth.CABundle = ca
	auth.CAFrom = sources.CAKeyOf("spec.source.oci.secretRef", secret.Namespace+"/"+secret.Name)
	return auth, nil
}
