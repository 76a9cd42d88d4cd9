package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"filippo.io/age"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/internal/sopstest"
	"github.com/capstan-dev/capstan/reconciler"
)

// devCredentialsFile is the mgmt example's sops-encrypted BMC Secrets.
var devCredentialsFile = filepath.Join("clusters", "mgmt", "overlay", "bmc-credentials.yaml")

// demoKey is the examples' public demo age key.
func demoKey(t *testing.T) *age.X25519Identity {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "examples", "DEMO-KEY-NOT-SECRET.agekey"))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := age.ParseIdentities(bytes.NewReader(raw))
	if err != nil || len(ids) != 1 {
		t.Fatalf("examples/DEMO-KEY-NOT-SECRET.agekey: %d identities, %v", len(ids), err)
	}
	return ids[0].(*age.X25519Identity)
}

// rewriteDevCredentials writes the mgmt example's BMC Secrets again, one
// for every host of hosts.yaml with password+"-"+host, encrypted for the
// demo key as `sops encrypt` would: an operator's edit of the file.
func rewriteDevCredentials(t *testing.T, examples, password string) {
	t.Helper()
	hosts, err := os.ReadFile(filepath.Join(examples, devHostsFile))
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, m := range regexp.MustCompile(`credentialsName: (\S+)-bmc`).FindAllStringSubmatch(string(hosts), -1) {
		docs = append(docs, "apiVersion: v1\nkind: Secret\nmetadata:\n  name: "+m[1]+"-bmc\ntype: Opaque\nstringData:\n  username: admin\n  password: "+password+"-"+m[1]+"\n")
	}
	if len(docs) == 0 {
		t.Fatalf("%s names no BMC Secret", devHostsFile)
	}
	out := sopstest.EncryptSecretYAML(t, strings.Join(docs, "---\n"), demoKey(t))
	if err := os.WriteFile(filepath.Join(examples, devCredentialsFile), []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
}

// devKubeconfigPath is the path of the export line capstan dev prints.
func devKubeconfigPath(export string) string {
	return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(export), "export KUBECONFIG="))
}

// checkDevBMCPassword: the live BMC Secret of host in the dev control
// plane holds the plaintext password want, decrypted from the example's
// sops file.
func checkDevBMCPassword(ctx context.Context, t *testing.T, kubeconfig, host, want string) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Secret mgmt/"+host+"-bmc to hold the decrypted password", func() (bool, error) {
		s := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "mgmt", Name: host + "-bmc"}, s); err != nil {
			return false, err
		}
		if strings.HasPrefix(string(s.Data["password"]), "ENC[") {
			t.Fatalf("Secret mgmt/%s-bmc holds the ciphertext", host)
		}
		return string(s.Data["password"]) == want && string(s.Data["username"]) == "admin", nil
	})
}

// createDemoKeySecret creates in ns the Secret the example
// ClusterDeployments name in spec.decryption, holding the demo key, as
// capstan dev does in its own namespace.
func createDemoKeySecret(t *testing.T, c client.Client, ns string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "examples", "DEMO-KEY-NOT-SECRET.agekey"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sops-age", Namespace: ns},
		Data: map[string][]byte{"demo.agekey": raw}}); err != nil {
		t.Fatal(err)
	}
}
