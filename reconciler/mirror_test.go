package reconciler

import (
	"context"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// The mirrors a move recorded are status, which Capstan acts on as
// itself: a tenant's deployment whose record names an object of another
// namespace has it neither read nor written there; its own are refreshed.
// The target is the same control plane, through a kubeconfig Secret.
func TestMirrorsAreRefreshedOnlyInTheDeploymentsNamespace(t *testing.T) {
	env := controlPlane(t)
	ctx := t.Context()
	if err := testenv.InstallCRDs(ctx, env.Config, "../manifests/crds/capstan.dev_clusterdeployments.yaml"); err != nil {
		t.Fatal(err)
	}
	team, err := env.CreateNamespace(ctx, "mirror-team")
	if err != nil {
		t.Fatal(err)
	}
	other, err := env.CreateNamespace(ctx, "mirror-other")
	if err != nil {
		t.Fatal(err)
	}
	reads := map[string]*atomic.Int32{team: {}, other: {}}
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	counted := interceptor.NewClient(c, interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if _, isCD := obj.(*capstanv1.ClusterDeployment); !isCD {
			if n := reads[key.Namespace]; n != nil {
				n.Add(1)
			}
		}
		return c.Get(ctx, key, obj, opts...)
	}})
	kubeconfig, err := os.ReadFile(env.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "target-kubeconfig"},
		Data: map[string][]byte{capstanv1.DefaultKubeConfigKey: kubeconfig}}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{team, other} {
		if err := c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mirrored"}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, cd := range []*capstanv1.ClusterDeployment{
		{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "moved"}, Spec: capstanv1.ClusterDeploymentSpec{Path: "clusters/moved"}},
	} {
		if err := c.Create(ctx, cd); err != nil {
			t.Fatal(err)
		}
	}
	cd := &capstanv1.ClusterDeployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: team, Name: "moved"}, cd); err != nil {
		t.Fatal(err)
	}
	cd.Status.Pivot = &capstanv1.PivotStatus{
		KubeConfig: &capstanv1.SecretKeyReference{Name: "target-kubeconfig"},
		Mirrors: []capstanv1.ObjectReference{
			{APIVersion: "v1", Kind: "ConfigMap", Namespace: other, Name: "mirrored"},
			{APIVersion: "v1", Kind: "ConfigMap", Namespace: team, Name: "mirrored"},
		},
	}
	r := &Reconciler{client: counted, clusters: newClusterCache(c, Scheme(), &kubeconfigRules{home: "capstan-system"})}
	err = r.mirror(ctx, cd)
	if err == nil || !strings.Contains(err.Error(), "status.pivot.mirrors: ConfigMap "+other+"/mirrored is not in the deployment's namespace "+team) {
		t.Errorf("mirror with a record naming another namespace = %v; want the refusal naming it", err)
	}
	if n := reads[other].Load(); n != 0 {
		t.Errorf("Capstan read the mirror in namespace %s %d times for a deployment of %s, want none", other, n, team)
	}
	if n := reads[team].Load(); n == 0 {
		t.Errorf("the mirror in the deployment's own namespace was not refreshed")
	}
}
