package e2e

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/sopstest"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/render"
)

// sopsEncryptYAML encrypts a YAML file as `sops encrypt --age` does, with
// the sops library (internal/sopstest): the values of data and
// stringData, for recipients.
func sopsEncryptYAML(t *testing.T, plain string, recipients ...*age.X25519Identity) string {
	t.Helper()
	return sopstest.EncryptSecretYAML(t, plain, recipients...)
}

func bmcSecretYAML(host, password string) string {
	return `apiVersion: v1
kind: Secret
metadata:
  name: ` + host + `-bmc
  namespace: ${NS}
stringData:
  username: admin
  password: ` + password + `
`
}

// An overlay with age-encrypted BMC Secrets: while the key Secret is
// missing the deployment is Stalled and nothing is applied; once it
// exists the Secrets are applied with their plaintext, which shows
// nowhere else (logs, events, status, the artifact cache); a rotation to
// a new key, with the files re-encrypted, rolls out like any revision.
func TestSopsEncryptedSecretsFromGit(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	ctx := context.Background()
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	oldKey, newKey := sopsKey(t), sopsKey(t)
	const planted, rotated = "PLANTED-bmc-pass-7f3a9c", "ROTATED-bmc-pass-41d0e2"
	files := func(password string, to *age.X25519Identity) map[string]string {
		return map[string]string{
			"clusters/metal/kustomization.yaml": "resources: [host-0.yaml, host-1.yaml]\n",
			"clusters/metal/host-0.yaml":        sopsEncryptYAML(t, bmcSecretYAML("host-0", password), to),
			"clusters/metal/host-1.yaml":        sopsEncryptYAML(t, bmcSecretYAML("host-1", password), to),
		}
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files(planted, oldKey), "encrypted BMC secrets"); err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	cacheDir := t.TempDir()
	_, counter := startDaemonWith(t, nil, func(o *reconciler.Options) {
		o.Logger = logs.logger()
		o.Artifacts.CacheDir = cacheDir
	})
	createDeployment(t, c, ns, "metal", capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: url, Ref: capstanv1.GitRef{Branch: "main"},
			SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(t, c, ns)},
		}},
		Path:       "clusters/metal",
		Substitute: map[string]string{"NS": ns},
		Interval:   &metav1.Duration{Duration: 500 * time.Millisecond},
		Decryption: &capstanv1.DecryptionSpec{Provider: capstanv1.DecryptionSOPS, SecretRef: capstanv1.LocalObjectReference{Name: "sops-keys"}},
	})

	// No key Secret: Stalled, naming it, nothing applied.
	waitDeployment(t, c, ns, "metal", "Stalled for want of the key Secret", func(cd *capstanv1.ClusterDeployment) bool {
		s := condition(cd, capstanv1.ConditionStalled)
		return s != nil && s.Status == metav1.ConditionTrue && s.Reason == reconciler.ReasonDecryptionSecretNotFound && strings.Contains(s.Message, "sops-keys")
	})
	if n := counter.total("/namespaces/" + ns + "/secrets/host-"); n > 0 {
		t.Fatalf("%d writes to the BMC Secrets while the key was missing: %v", n, counter.snapshot())
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "host-0-bmc"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("host-0-bmc exists while the key is missing: %v", err)
	}

	// The key Secret appears: the deployment recovers without a commit.
	keys := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sops-keys", Namespace: ns},
		Data: map[string][]byte{"old.agekey": []byte(oldKey.String() + "\n")}}
	if err := c.Create(ctx, keys); err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, c, ns, "metal", "Ready once the key Secret exists", isReady)
	for _, host := range []string{"host-0-bmc", "host-1-bmc"} {
		waitSecretValue(t, c, ns, host, planted)
	}

	// Rotation: the new key is added, the files re-encrypted for it only.
	keys.Data["new.agekey"] = []byte(newKey.String() + "\n")
	if err := c.Update(ctx, keys); err != nil {
		t.Fatal(err)
	}
	second, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files(rotated, newKey), "rotate the sops key")
	if err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, c, ns, "metal", "Ready at the rotated revision", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Revision == "main@sha1:"+second && isReady(cd)
	})
	for _, host := range []string{"host-0-bmc", "host-1-bmc"} {
		waitSecretValue(t, c, ns, host, rotated)
	}

	// The plaintext is nowhere but in the live Secrets.
	cd := getDeployment(t, c, ns, "metal")
	status, _ := json.Marshal(cd.Status)
	var events eventsv1.EventList
	if err := c.List(ctx, &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	eventText, _ := json.Marshal(events.Items)
	for _, secret := range []string{planted, rotated} {
		for where, text := range map[string]string{"the daemon's logs": logs.String(), "the status": string(status), "the events": string(eventText)} {
			if strings.Contains(text, secret) {
				t.Errorf("%s hold the plaintext %q", where, secret)
			}
		}
		if hit := grepDir(t, cacheDir, secret); hit != "" {
			t.Errorf("the artifact cache holds the plaintext %q in %s", secret, hit)
		}
		for _, k := range []*age.X25519Identity{oldKey, newKey} {
			if strings.Contains(logs.String(), k.String()) || strings.Contains(string(status), k.String()) {
				t.Error("a private key reached the logs or the status")
			}
		}
	}
	if grepDir(t, cacheDir, "ENC[AES256_GCM") == "" {
		t.Error("the artifact cache holds no ciphertext: is it the cache the daemon used?")
	}
}

// A file encrypted for a key the Secret does not hold stalls the
// deployment with DecryptionKeyMismatch, naming the file, the object and
// the recipient, and nothing of it is applied.
func TestSopsWrongKeyIsStalled(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	fileKey, heldKey := sopsKey(t), sopsKey(t)
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, map[string]string{
		"clusters/metal/kustomization.yaml": "resources: [host-0.yaml]\n",
		"clusters/metal/host-0.yaml":        sopsEncryptYAML(t, bmcSecretYAML("host-0", "PLANTED-never-applied"), fileKey),
	}, "encrypted for another key"); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sops-keys", Namespace: ns},
		Data: map[string][]byte{"held.agekey": []byte(heldKey.String())}}); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, nil)
	createDeployment(t, c, ns, "metal", capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: url, Ref: capstanv1.GitRef{Branch: "main"},
			SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(t, c, ns)},
		}},
		Path:       "clusters/metal",
		Substitute: map[string]string{"NS": ns},
		Decryption: &capstanv1.DecryptionSpec{Provider: capstanv1.DecryptionSOPS, SecretRef: capstanv1.LocalObjectReference{Name: "sops-keys"}},
	})
	cd := waitDeployment(t, c, ns, "metal", "Stalled on the wrong key", func(cd *capstanv1.ClusterDeployment) bool {
		s := condition(cd, capstanv1.ConditionStalled)
		return s != nil && s.Status == metav1.ConditionTrue && s.Reason == render.ReasonDecryptionKeyMismatch
	})
	msg := condition(cd, capstanv1.ConditionStalled).Message
	for _, want := range []string{"clusters/metal/host-0.yaml", "Secret/${NS}/host-0-bmc", fileKey.Recipient().String()} {
		if !strings.Contains(msg, want) {
			t.Errorf("message does not name %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "AGE-SECRET-KEY") || strings.Contains(msg, "PLANTED") {
		t.Errorf("message leaks a key or a value: %s", msg)
	}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "host-0-bmc"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("host-0-bmc was applied: %v", err)
	}
}

func sopsKey(t *testing.T) *age.X25519Identity { return sopstest.NewAgeKey(t) }

func waitSecretValue(t *testing.T, c client.Client, ns, name, want string) {
	t.Helper()
	waitFor(t, "Secret "+name+" to hold the plaintext", func() (bool, error) {
		s := &corev1.Secret{}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
			return false, err
		}
		return string(s.Data["password"]) == want, nil
	})
}

// grepDir returns the first file below dir that contains s, or "".
func grepDir(t *testing.T, dir, s string) string {
	t.Helper()
	var hit string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || hit != "" {
			return err
		}
		data, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(data), s) {
			hit = p
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hit
}
