package reconciler

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/render"
)

// ReasonDecryptionSecretNotFound: the Secret spec.decryption.secretRef (or
// capstan run's --decryption-secret) names does not exist or cannot be
// read. Stalled, since a person must create it, but looked at again
// every decryptionRecheck: creating the Secret heals the deployment
// without a new commit.
const ReasonDecryptionSecretNotFound = "DecryptionSecretNotFound"

// decryptionRecheck is how soon a deployment stalled on its decryption
// keys looks again: the fix (creating the Secret, adding a key) lies
// outside the revision, and no watch reports it.
const decryptionRecheck = 15 * time.Second

// decryptionSecretName is the Secret that holds cd's decryption keys, and
// the field that names it: spec.decryption, else the daemon's default for
// deployments of the root source; "" when there is none.
func (r *Reconciler) decryptionSecretName(cd *capstanv1.ClusterDeployment) (name, field string) {
	if d := cd.Spec.Decryption; d != nil && d.SecretRef.Name != "" {
		return d.SecretRef.Name, "spec.decryption.secretRef"
	}
	if cd.Spec.Source == nil && r.opts.DecryptionSecret != "" {
		return r.opts.DecryptionSecret, "capstan run --decryption-secret"
	}
	return "", ""
}

// decryptionKeys reads the keys cd's render decrypts with. A deployment
// without a key Secret still gets (empty) keys: an encrypted file then
// stalls it with DecryptionKeyMissing instead of its ciphertext being
// applied. The Secret is read from the API every time (a render happens
// once per revision), so that a key added for a rotation is used at once.
func (r *Reconciler) decryptionKeys(ctx context.Context, cd *capstanv1.ClusterDeployment) (*render.Keys, error) {
	name, field := r.decryptionSecretName(cd)
	if name == "" {
		return &render.Keys{}, nil
	}
	if d := cd.Spec.Decryption; d != nil && d.Provider != "" && d.Provider != capstanv1.DecryptionSOPS {
		return nil, failure.Stalled(render.ReasonDecryptionUnsupportedKey, fmt.Errorf("spec.decryption.provider %q: only %q is supported", d.Provider, capstanv1.DecryptionSOPS))
	}
	secret := &corev1.Secret{}
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: cd.Namespace, Name: name}, secret); err != nil {
		what := "cannot be read"
		if apierrors.IsNotFound(err) {
			what = "does not exist"
		}
		return nil, &failure.Error{Reason: ReasonDecryptionSecretNotFound, Policy: failure.PolicyStalled, RetryAfter: decryptionRecheck,
			Err: fmt.Errorf("%s: Secret %s/%s %s; create it with the age (*.agekey) or OpenPGP (*.asc) private keys of the encrypted files, nothing is applied until then (docs/secrets.md): %w",
				field, cd.Namespace, name, what, err)}
	}
	keys, err := render.ParseKeys(secret.Data)
	if err != nil {
		// The fix is in the Secret, outside the revision: look again.
		return nil, &failure.Error{Reason: keyFileReason(err), Policy: failure.PolicyStalled, RetryAfter: decryptionRecheck,
			Err: fmt.Errorf("%s: Secret %s/%s: %w", field, cd.Namespace, name, err)}
	}
	if keys.Len() == 0 {
		return nil, &failure.Error{Reason: render.ReasonDecryptionKeyMissing, Policy: failure.PolicyStalled, RetryAfter: decryptionRecheck,
			Err: fmt.Errorf("%s: Secret %s/%s holds no key ending in %s or %s", field, cd.Namespace, name, render.AgeKeySuffix, render.PGPKeySuffix)}
	}
	return keys, nil
}

func keyFileReason(err error) string {
	var ke *render.KeyFileError
	if errors.As(err, &ke) {
		return ke.Reason
	}
	return render.ReasonDecryptionFailed
}

// decryptionRetry makes a render that failed for want of a key look again
// every decryptionRecheck: adding the key to the Secret heals it without
// a new revision. Other failures are left as they are.
func decryptionRetry(err error) error {
	f, ok := failure.From(err)
	if !ok || (f.Reason != render.ReasonDecryptionKeyMissing && f.Reason != render.ReasonDecryptionKeyMismatch) {
		return err
	}
	return &failure.Error{Reason: f.Reason, Policy: failure.PolicyStalled, RetryAfter: decryptionRecheck, Err: err}
}
