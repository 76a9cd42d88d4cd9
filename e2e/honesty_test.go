package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/sources/git"
)

// A dependency Ready at an older revision than its source has now is not
// Ready for its dependents: what it applies is about to change. The
// dependent waits, naming both revisions, and goes on once the dependency
// is Ready at the new one. Both poll hourly; reconcile requests move them.
func TestDependsOnWaitsForTheDependencysCurrentRevision(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	files := func(layer string) map[string]string {
		f := twoStageFiles("1")
		f["clusters/layer/kustomization.yaml"] = "resources: [layer.yaml]\n"
		f["clusters/layer/layer.yaml"] = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: layer, namespace: \"${NS}\"}\ndata: {layer: \"" + layer + "\"}\n"
		return f
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files("1"), "machines and a layer"); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, nil)
	machines := twoStageSpec(url, ns, gitSecret(t, c, ns))
	machines.Interval = &metav1.Duration{Duration: time.Hour}
	createDeployment(t, c, ns, "machines", machines)
	createDeployment(t, c, ns, "layer", capstanv1.ClusterDeploymentSpec{
		Source: machines.Source, Path: "clusters/layer", Substitute: map[string]string{"NS": ns},
		Interval:  &metav1.Duration{Duration: time.Hour},
		DependsOn: []capstanv1.DependencyReference{{Name: "machines"}},
	})
	waitFor(t, "Widget infra", func() (bool, error) { return object(t, c, widgetGVK, ns, "infra") != nil, nil })
	setWidgetReady(t, c, ns, "infra")
	waitDeployment(t, c, ns, "layer", "Ready", isReady)

	second, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files("2"), "the layer's second revision")
	if err != nil {
		t.Fatal(err)
	}
	requestReconcile(t, c, ns, "layer")
	cd := waitDeployment(t, c, ns, "layer", "waiting for machines at the new revision", func(cd *capstanv1.ClusterDeployment) bool {
		r := condition(cd, capstanv1.ConditionReady)
		return r != nil && r.Reason == reconciler.ReasonDependencyNotReady
	})
	if msg := condition(cd, capstanv1.ConditionReady).Message; !strings.Contains(msg, ns+"/machines") || !strings.Contains(msg, second) {
		t.Errorf("Ready says %q; want it to name machines and the revision it waits for", msg)
	}
	if got := object(t, c, configMapGVK, ns, "layer").Object["data"].(map[string]any)["layer"]; got != "1" {
		t.Fatalf("layer = %v while machines is Ready only at the old revision, want 1", got)
	}

	requestReconcile(t, c, ns, "machines")
	waitDeployment(t, c, ns, "machines", "Ready at the new revision", func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && strings.HasSuffix(cd.Status.Revision, second)
	})
	waitDeployment(t, c, ns, "layer", "Ready at the new revision", func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && strings.HasSuffix(cd.Status.Revision, second)
	})
	if got := object(t, c, configMapGVK, ns, "layer").Object["data"].(map[string]any)["layer"]; got != "2" {
		t.Errorf("layer = %v, want 2", got)
	}
}

// requestReconcile asks for a reconcile now, as `capstan reconcile` does.
func requestReconcile(t testing.TB, c client.Client, ns, name string) {
	t.Helper()
	cd := getDeployment(t, c, ns, name)
	patch := client.MergeFrom(cd.DeepCopy())
	if cd.Annotations == nil {
		cd.Annotations = map[string]string{}
	}
	cd.Annotations[reconciler.ReconcileRequestedAnnotation] = time.Now().Format(time.RFC3339Nano)
	if err := c.Patch(context.Background(), cd, patch); err != nil {
		t.Fatal(err)
	}
}

// The root source's credentials come from flags of capstan run, not from
// a Secret: its authentication error says which.
func TestRootSourceAuthErrorNamesTheFlags(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, rootCluster("alpha", ns), "add alpha"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		auth git.Auth
		want []string
	}{
		{"no credentials", git.Auth{}, []string{"requires credentials", "--source-username", "$CAPSTAN_SOURCE_PASSWORD"}},
		{"wrong password", git.Auth{Username: "capstan", Password: "not-the-token"}, []string{"refused the credentials", "--source-username", "$CAPSTAN_SOURCE_PASSWORD"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := startDaemon(t, &reconciler.RootOptions{
				URL: url, Path: "clusters", Namespace: ns, Interval: 500 * time.Millisecond, Auth: tc.auth,
			})
			var msg string
			waitFor(t, "the root source's authentication error", func() (bool, error) {
				if err := d.RootStatus().Err; err != nil {
					msg = err.Error()
					return true, nil
				}
				return false, nil
			})
			for _, want := range append(tc.want, "authentication failed") {
				if !strings.Contains(msg, want) {
					t.Errorf("root source error %q does not say %q", msg, want)
				}
			}
			if strings.Contains(msg, "secretRef") {
				t.Errorf("root source error %q points to a secretRef, which the root source has none of", msg)
			}
			if strings.Contains(msg, "not-the-token") {
				t.Errorf("root source error %q holds the password", msg)
			}
			stopDaemon(d)
		})
	}
	if list := (&capstanv1.ClusterDeploymentList{}); c.List(context.Background(), list, client.InNamespace(ns)) == nil && len(list.Items) > 0 {
		t.Errorf("a root source refused by the server applied %d ClusterDeployments", len(list.Items))
	}
}
