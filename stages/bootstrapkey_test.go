package stages_test

import (
	"bytes"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// The bootstrap key is generated once per namespace, its private half
// matches the public half handed out, and a stage with bootstrapKey copies
// both to bootstrap-key-<cluster>.
func TestBootstrapKey(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	ctx := testContext(t)

	first, err := e.EnsureBootstrapKey(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.EnsureBootstrapKey(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if first != again {
		t.Fatalf("EnsureBootstrapKey gave %q, then %q: the key must be made once", first, again)
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(first))
	if err != nil {
		t.Fatalf("public key %q: %v", first, err)
	}
	key := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: stages.BootstrapKeySecret}, key); err != nil {
		t.Fatal(err)
	}
	if key.Type != corev1.SecretTypeSSHAuth {
		t.Errorf("Secret type %s, want %s", key.Type, corev1.SecretTypeSSHAuth)
	}
	signer, err := ssh.ParsePrivateKey(key.Data[corev1.SSHAuthPrivateKey])
	if err != nil {
		t.Fatalf("private key: %v", err)
	}
	if !bytes.Equal(signer.PublicKey().Marshal(), pub.Marshal()) {
		t.Error("the private key does not belong to the public key handed out")
	}

	stage := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "ClusterSSHConfigured",
		BootstrapKey: &capstanv1.BootstrapKeySpec{ClusterName: "mgmt"}},
		Objects: []*unstructured.Unstructured{configMap(ns, "ssh", map[string]any{"authorized": first})}}
	o := stages.Owner{Name: "mgmt", Namespace: ns}
	if res := e.ApplyStage(ctx, stage, o); res.State == capstanv1.StageFailed {
		t.Fatalf("apply: %v", res.Err)
	}
	copied := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bootstrap-key-mgmt"}, copied); err != nil {
		t.Fatalf("the copy: %v", err)
	}
	if !bytes.Equal(copied.Data[corev1.SSHAuthPrivateKey], key.Data[corev1.SSHAuthPrivateKey]) ||
		strings.TrimSpace(string(copied.Data["ssh-publickey"])) != first {
		t.Error("bootstrap-key-mgmt does not hold the bootstrap key")
	}
	if copied.Labels[stages.OwnerGroup+"/name"] != "mgmt" {
		t.Errorf("the copy's labels %v do not tie it to its deployment", copied.Labels)
	}
}

// ReadBootstrapKey only reads: no Secret, nothing found and nothing made;
// the daemon's key, its public half; a Secret without one, an error that
// names the Secret and the field, and nothing of the private half.
func TestReadBootstrapKey(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	ctx := testContext(t)

	if pub, found, err := stages.ReadBootstrapKey(ctx, c, ns); err != nil || found || pub != "" {
		t.Fatalf("before the key is made: %q, found %v, %v; want nothing", pub, found, err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: stages.BootstrapKeySecret}, &corev1.Secret{}); err == nil {
		t.Fatal("ReadBootstrapKey made the Secret")
	}
	made, err := stages.NewExecutor(c).EnsureBootstrapKey(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if pub, found, err := stages.ReadBootstrapKey(ctx, c, ns); err != nil || !found || pub != made {
		t.Fatalf("after: %q, found %v, %v; want %q", pub, found, err, made)
	}

	bad := newNamespace(t)
	const private = "planted-private-half-81c2"
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: stages.BootstrapKeySecret, Namespace: bad},
		Data: map[string][]byte{"ssh-publickey": []byte("not a key " + private), corev1.SSHAuthPrivateKey: []byte(private)}}); err != nil {
		t.Fatal(err)
	}
	_, found, err := stages.ReadBootstrapKey(ctx, c, bad)
	if err == nil || !found || !stages.IsStalled(err) {
		t.Fatalf("a Secret without a public key: found %v, %v; want found and a stalled error", found, err)
	}
	for _, want := range []string{bad + "/" + stages.BootstrapKeySecret, "data.ssh-publickey"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if strings.Contains(err.Error(), private) {
		t.Errorf("error %q shows the Secret's data", err)
	}
}
