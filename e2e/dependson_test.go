package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
)

// A deployment with dependsOn applies nothing until the deployment it
// names is Ready, says so, and starts as soon as that one turns Ready:
// the dependency's readiness wakes it, no poll interval (1 h here) needed.
func TestDependsOnWaitsForTheDependency(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	files := twoStageFiles("1")
	files["clusters/layer/kustomization.yaml"] = "resources: [layer.yaml]\n"
	files["clusters/layer/layer.yaml"] = `apiVersion: v1
kind: ConfigMap
metadata: {name: layer, namespace: "${NS}"}
data: {on: machines}
`
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "machines and a layer on them"); err != nil {
		t.Fatal(err)
	}
	secret := gitSecret(t, c, ns)
	startDaemon(t, nil)
	machines := twoStageSpec(url, ns, secret)
	machines.Interval = &metav1.Duration{Duration: time.Hour}
	createDeployment(t, c, ns, "machines", machines)
	layer := capstanv1.ClusterDeploymentSpec{
		Source:     machines.Source,
		Path:       "clusters/layer",
		Substitute: map[string]string{"NS": ns},
		Interval:   &metav1.Duration{Duration: time.Hour},
		DependsOn:  []capstanv1.DependencyReference{{Name: "machines"}},
	}
	createDeployment(t, c, ns, "layer", layer)

	cd := waitDeployment(t, c, ns, "layer", "waiting on its dependency", func(cd *capstanv1.ClusterDeployment) bool {
		r := condition(cd, capstanv1.ConditionReady)
		return r != nil && r.Reason == "DependencyNotReady"
	})
	if msg := condition(cd, capstanv1.ConditionReady).Message; !strings.Contains(msg, ns+"/machines") {
		t.Errorf("Ready message %q does not name the dependency", msg)
	}
	waitDeployment(t, c, ns, "machines", "stage Infra applied", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "Infra").AppliedAt != nil
	})
	if object(t, c, configMapGVK, ns, "layer") != nil {
		t.Fatal("the layer was applied while its dependency was not Ready")
	}

	setWidgetReady(t, c, ns, "infra")
	waitDeployment(t, c, ns, "machines", "Ready", isReady)
	ready := time.Now()
	waitDeployment(t, c, ns, "layer", "Ready", isReady)
	t.Logf("dependency Ready -> dependent Ready in %s (interval 1h)", time.Since(ready).Round(time.Millisecond))
	if object(t, c, configMapGVK, ns, "layer") == nil {
		t.Error("layer Ready but its ConfigMap is missing")
	}
}

// Deployments that depend on each other in a cycle say which cycle instead
// of waiting silently, and start once an edit breaks it.
func TestDependsOnCycleIsReportedUntilBroken(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("1"), "overlay"); err != nil {
		t.Fatal(err)
	}
	secret := gitSecret(t, c, ns)
	startDaemon(t, nil)
	// Each deployment applies the overlay into a namespace of its own: an
	// object has one owner.
	objectsOf := map[string]string{"a": newNamespace(t), "b": ns}
	for _, pair := range [][2]string{{"a", "b"}, {"b", "a"}} {
		spec := twoStageSpec(url, ns, secret)
		spec.Substitute = map[string]string{"NS": objectsOf[pair[0]]}
		spec.DependsOn = []capstanv1.DependencyReference{{Name: pair[1]}}
		createDeployment(t, c, ns, pair[0], spec)
	}
	cd := waitDeployment(t, c, ns, "a", "reporting the cycle", func(cd *capstanv1.ClusterDeployment) bool {
		r := condition(cd, capstanv1.ConditionReady)
		return r != nil && r.Reason == "DependencyCycle"
	})
	want := ns + "/a -> " + ns + "/b -> " + ns + "/a"
	if msg := condition(cd, capstanv1.ConditionReady).Message; !strings.Contains(msg, want) {
		t.Errorf("Ready message %q does not show the cycle %s", msg, want)
	}
	for _, objNS := range objectsOf {
		if object(t, c, widgetGVK, objNS, "infra") != nil {
			t.Error("a deployment of the cycle applied its objects")
		}
	}

	// Breaking the cycle on b lets b start at once, and a after it.
	b := getDeployment(t, c, ns, "b")
	b.Spec.DependsOn = nil
	if err := c.Update(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, c, ns, "b", "stage Infra applied", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "Infra").AppliedAt != nil
	})
	setWidgetReady(t, c, ns, "infra")
	waitDeployment(t, c, ns, "a", "stage Infra applied once b is Ready", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "Infra").AppliedAt != nil
	})
	setWidgetReady(t, c, objectsOf["a"], "infra")
	waitDeployment(t, c, ns, "a", "Ready", isReady)
}
