package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/render"
)

// devDemoKeyFile is the age key the examples' encrypted files are
// encrypted for. It is public on purpose (its name says so): the demo
// must decrypt without asking the user for a key.
const devDemoKeyFile = "DEMO-KEY-NOT-SECRET.agekey"

// devDecryptionSecret is the Secret the example ClusterDeployments name in
// spec.decryption, and the demo daemon's --decryption-secret.
const devDecryptionSecret = "sops-age"

// ensureDevDecryptionKey creates the decryption Secret of the examples in
// the demo's namespace from the demo key, as an operator creates theirs
// with kubectl (docs/secrets.md). A Secret that exists is left as it is:
// in a control plane the user keeps, they may have put their own key in.
func ensureDevDecryptionKey(ctx context.Context, c client.Client, repo string) error {
	keyFile := filepath.Join(repo, "examples", devDemoKeyFile)
	key, err := os.ReadFile(keyFile)
	if err != nil {
		return fmt.Errorf("the examples' demo decryption key: %w", err)
	}
	// A broken key file would stall every example with a message about a
	// Secret the user never made: say it here, naming the file.
	if _, err := render.ParseKeys(map[string][]byte{devDemoKeyFile: key}); err != nil {
		return fmt.Errorf("%s: %w", keyFile, err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: devDecryptionSecret, Namespace: devNamespace,
			Labels: map[string]string{"app.kubernetes.io/part-of": "capstan-dev"}},
		Data: map[string][]byte{"demo" + render.AgeKeySuffix: key},
	}
	if err := c.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create the decryption Secret %s/%s: %w", devNamespace, devDecryptionSecret, err)
	}
	return nil
}
