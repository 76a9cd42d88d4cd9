package pivot

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// The one mirror rule, row by row: what a move keeps in the source and
// why, whichever caller runs it.
func TestKeepRule(t *testing.T) {
	source, _ := clients(t)
	ns, err := sourceEnv.CreateNamespace(t.Context(), "keep")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{
		`{apiVersion: capstan.dev/v1alpha1, kind: ClusterDeployment, metadata: {name: mgmt}, spec: {path: clusters/mgmt, profile: capm3}}`,
		// Another deployment of the namespace, still here: its source
		// credentials must survive the move of mgmt.
		`{apiVersion: capstan.dev/v1alpha1, kind: ClusterDeployment, metadata: {name: other},
		  spec: {path: clusters/other, profile: capm3, source: {git: {url: "https://git.example/other.git", secretRef: {name: shared-creds}}}}}`,
	} {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		u.SetNamespace(ns)
		if err := source.Create(t.Context(), u); err != nil {
			t.Fatal(err)
		}
	}
	cd := &capstanv1.ClusterDeployment{}
	cd.Namespace, cd.Name = ns, "mgmt"
	m := Move{Namespace: ns, Name: "mgmt", Source: Cluster{Client: source},
		Start: capstanv1.PivotStatus{KubeConfig: &capstanv1.SecretKeyReference{Name: "target-kubeconfig", Key: "value"}},
		Held:  []string{"held-creds"}}
	keep, err := keepRule(t.Context(), m, cd)
	if err != nil {
		t.Fatal(err)
	}
	secret := func(namespace, name string) Object {
		return Object{APIVersion: "v1", Kind: "Secret", Namespace: namespace, Name: name}
	}
	rows := []struct {
		why  string
		o    Object
		keep bool
	}{
		{"a Cluster API Cluster is a mirror", Object{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: "Cluster", Namespace: ns, Name: "mgmt"}, true},
		{"the deployment is its own record", Object{APIVersion: "capstan.dev/v1alpha1", Kind: "ClusterDeployment", Namespace: ns, Name: "mgmt"}, true},
		{"the mirrors are refreshed through the target's kubeconfig", secret(ns, "target-kubeconfig"), true},
		{"another deployment here names it", secret(ns, "shared-creds"), true},
		{"the caller reads it until the handover", secret(ns, "held-creds"), true},
		{"a BMC Secret moves and goes", secret(ns, "mgmt-cp-0-bmc"), false},
		{"a shared name in another namespace is another Secret", secret("elsewhere", "shared-creds"), false},
		{"a Metal3Cluster moves and goes", Object{APIVersion: "infrastructure.cluster.x-k8s.io/v1beta2", Kind: "Metal3Cluster", Namespace: ns, Name: "mgmt"}, false},
	}
	for _, r := range rows {
		if got := keep(r.o); got != r.keep {
			t.Errorf("%s: keep(%s) = %t, want %t", r.why, r.o, got, r.keep)
		}
	}
}
