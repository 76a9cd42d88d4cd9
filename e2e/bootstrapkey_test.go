package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/stages"
)

// A stage with bootstrapKey (the bootstrap profile's ClusterSSHConfigured)
// always gives the cluster Capstan's bootstrap SSH key: the overlay
// receives its public half as ${CAPSTAN_BOOTSTRAP_SSH_KEY}, the stage
// copies the key to bootstrap-key-<cluster>, and the private half shows up
// nowhere but in the two Secrets. An overlay that leaves the key out is
// refused, saying where to put it.
func TestBootstrapKeyIsAddedAndCopied(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"clusters/ssh/kustomization.yaml": "resources: [keys.yaml]\n",
		"clusters/ssh/keys.yaml": `apiVersion: v1
kind: ConfigMap
metadata: {name: machine-ssh-keys, namespace: "${NS}"}
data:
  authorized_keys: |
    ${CAPSTAN_BOOTSTRAP_SSH_KEY}
`,
		"clusters/forgot/kustomization.yaml": "resources: [keys.yaml]\n",
		"clusters/forgot/keys.yaml": `apiVersion: v1
kind: ConfigMap
metadata: {name: other-keys, namespace: "${NS}"}
data: {authorized_keys: "ssh-ed25519 AAAA operator"}
`,
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "ssh keys"); err != nil {
		t.Fatal(err)
	}
	secret := gitSecret(t, c, ns)
	spec := func(path string) capstanv1.ClusterDeploymentSpec {
		return capstanv1.ClusterDeploymentSpec{
			Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: url,
				SecretRef: &capstanv1.LocalObjectReference{Name: secret}}},
			Path:       path,
			Substitute: map[string]string{"NS": ns},
			Interval:   &metav1.Duration{Duration: time.Minute},
			Stages: []capstanv1.StageSpec{{Name: "ClusterSSHConfigured", Select: capstanv1.Selector{Kinds: []string{"ConfigMap"}},
				BootstrapKey: &capstanv1.BootstrapKeySpec{ClusterName: "edge-1"}}},
		}
	}
	startDaemon(t, nil)
	createDeployment(t, c, ns, "ssh", spec("clusters/ssh"))
	createDeployment(t, c, ns, "forgot", spec("clusters/forgot"))

	done := waitDeployment(t, c, ns, "ssh", "Ready", isReady)
	key := &corev1.Secret{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: stages.BootstrapKeySecret}, key); err != nil {
		t.Fatal(err)
	}
	public := strings.TrimSpace(string(key.Data["ssh-publickey"]))
	cm := object(t, c, configMapGVK, ns, "machine-ssh-keys")
	if got, _, _ := unstructured.NestedString(cm.Object, "data", "authorized_keys"); strings.TrimSpace(got) != public {
		t.Errorf("the machines' authorized_keys = %q, want the bootstrap key %q", got, public)
	}
	copied := &corev1.Secret{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "bootstrap-key-edge-1"}, copied); err != nil {
		t.Fatalf("bootstrap-key-edge-1: %v", err)
	}
	if string(copied.Data[corev1.SSHAuthPrivateKey]) != string(key.Data[corev1.SSHAuthPrivateKey]) {
		t.Error("bootstrap-key-edge-1 does not hold the bootstrap key")
	}

	forgot := waitDeployment(t, c, ns, "forgot", "Stalled", func(cd *capstanv1.ClusterDeployment) bool {
		s := condition(cd, capstanv1.ConditionStalled)
		return s != nil && s.Status == metav1.ConditionTrue
	})
	if msg := condition(forgot, capstanv1.ConditionStalled).Message; !strings.Contains(msg, "${"+stages.BootstrapKeyVar+"}") {
		t.Errorf("Stalled message %q does not say to use ${%s}", msg, stages.BootstrapKeyVar)
	}

	// The private key is in no status and no event.
	private := strings.Split(strings.TrimSpace(string(key.Data[corev1.SSHAuthPrivateKey])), "\n")[1]
	events := &corev1.EventList{}
	if err := c.List(context.Background(), events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, v := range []any{done.Status, getDeployment(t, c, ns, "forgot").Status, events} {
		raw, _ := json.Marshal(v)
		if strings.Contains(string(raw), private) || strings.Contains(string(raw), "PRIVATE KEY") {
			t.Errorf("private key material in %T", v)
		}
	}
}
