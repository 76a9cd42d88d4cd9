package reconciler

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/sopstest"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/stages"
)

// A pull request the gate trusts is planned with the deployment's keys,
// as a reconcile renders it; a stranger's fork planned because of forks:
// plan is not: its author could have a kustomize replacement copy a
// decrypted value into a ConfigMap the plan shows (the scrub misses short
// values). The attack: the fork's overlay copies the BMC password into a
// ConfigMap. With the keys, the plaintext would be in the plan; without,
// the plan is an error that says why, naming no value.
func TestStrangersForkIsPlannedWithoutTheKeys(t *testing.T) {
	id := sopstest.NewAgeKey(t)
	const password = "hunter2"
	secret := sopstest.EncryptSecretYAML(t, "apiVersion: v1\nkind: Secret\nmetadata: {name: bmc, namespace: metal}\nstringData: {password: "+password+"}\n", id)
	fsys := fstest.MapFS{
		"app/kustomization.yaml": {Data: []byte(`resources: [bmc.yaml, leak.yaml]
replacements:
- source: {kind: Secret, name: bmc, fieldPath: stringData.password}
  targets:
  - select: {kind: ConfigMap, name: leak}
    fieldPaths: [data.copy]
`)},
		"app/bmc.yaml":  {Data: []byte(secret)},
		"app/leak.yaml": {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: leak, namespace: metal}\ndata: {copy: x}\n")},
	}
	keys := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "sops-age"},
		Data: map[string][]byte{"demo.agekey": sopstest.AgeKeyFile(id)}}
	r := &Reconciler{client: fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(keys).Build(), sources: newTestSourceCache(t, ArtifactOptions{})}
	p := &prPlanner{r: r}
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "app"},
		Spec: capstanv1.ClusterDeploymentSpec{Path: "app", Decryption: &capstanv1.DecryptionSpec{Provider: capstanv1.DecryptionSOPS,
			SecretRef: capstanv1.LocalObjectReference{Name: "sops-age"}}}}
	planText := func(plan *stages.Plan) string {
		var b strings.Builder
		for _, st := range plan.Stages {
			for _, obj := range st.Objects {
				data, _ := json.Marshal(obj.Object)
				b.Write(data)
			}
		}
		return b.String()
	}

	// Trusted: decrypted, and the replacement did copy the password (the
	// plan's diff then hides and scrubs it: docs/secrets.md).
	plan, err := p.plan(t.Context(), cd, fsys, true)
	if err != nil {
		t.Fatalf("plan with the keys: %v", err)
	}
	if !strings.Contains(planText(plan), password) {
		t.Fatalf("the trusted plan did not decrypt: the attack in this test no longer reaches the plaintext")
	}

	// A stranger's fork: no key, an error that says why.
	_, err = p.plan(t.Context(), cd, fsys, false)
	var de *render.DecryptError
	if !errors.Is(err, errForkNotDecrypted) || !errors.As(err, &de) || de.Reason != render.ReasonDecryptionKeyMissing {
		t.Fatalf("plan of a stranger's fork = %v; want it refused as not decrypted", err)
	}
	if strings.Contains(err.Error(), password) {
		t.Errorf("the error names the password: %v", err)
	}
}
