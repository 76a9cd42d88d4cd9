package e2e

import (
	"testing"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
)

// threeStageFiles: Base (a ConfigMap), Infra (a Widget that waits for its
// controller), App (a ConfigMap).
func threeStageFiles() map[string]string {
	return map[string]string{
		"clusters/three/kustomization.yaml": "resources: [objects.yaml]\n",
		"clusters/three/objects.yaml": `apiVersion: v1
kind: ConfigMap
metadata: {name: base, namespace: "${NS}", labels: {capstan.dev/stage: Base}}
data: {a: "1"}
---
apiVersion: test.capstan.dev/v1
kind: Widget
metadata: {name: infra, namespace: "${NS}", labels: {capstan.dev/stage: Infra}}
spec: {size: 1}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: app, namespace: "${NS}", labels: {capstan.dev/stage: App}}
data: {b: "2"}
`,
	}
}

func threeStageSpec(url, ns, secret string) capstanv1.ClusterDeploymentSpec {
	spec := twoStageSpec(url, ns, secret)
	spec.Path = "clusters/three"
	spec.Stages = []capstanv1.StageSpec{
		{Name: "Base"},
		{Name: "Infra", ReadyWhen: []capstanv1.ReadinessCheck{{Kind: "Widget", CEL: "object.status.ready == true"}}},
		{Name: "App"},
	}
	return spec
}

// A daemon killed while a stage waits is replaced by a new one: the new one
// resumes at the waiting stage, applies nothing again, and applies nothing
// of a later stage before the waiting one is ready.
func TestRestartMidPlanResumes(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, threeStageFiles(), "three stages"); err != nil {
		t.Fatal(err)
	}
	first, _ := startDaemon(t, nil)
	createDeployment(t, c, ns, "three", threeStageSpec(url, ns, gitSecret(t, c, ns)))
	waitDeployment(t, c, ns, "three", "stage Infra applied and waiting", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "Base").State == capstanv1.StageReady && stage(cd, "Infra").AppliedAt != nil
	})
	stopDaemon(first)
	before := getDeployment(t, c, ns, "three")

	_, api := startDaemon(t, nil)
	// Let the new daemon walk the plan a few times while Infra still waits
	// (each walk lists Infra's widgets).
	waitFor(t, "the new daemon to look at Infra twice", func() (bool, error) {
		return api.listsOf("/namespaces/"+ns+"/widgets") >= 2, nil
	})
	if got, want := stage(getDeployment(t, c, ns, "three"), "Infra").Attempts, stage(before, "Infra").Attempts; got != want {
		t.Errorf("stage Infra: %d attempts after the restart, want %d: the new daemon goes on with the attempt in progress", got, want)
	}
	if object(t, c, configMapGVK, ns, "app") != nil {
		t.Fatal("the restarted daemon applied stage App while Infra was not ready")
	}
	if n := api.total("PATCH /", "/configmaps/base"); n != 0 {
		t.Errorf("the restarted daemon applied Base's ConfigMap %d times; it was Ready, want 0", n)
	}
	if n := api.total("PATCH /", "/widgets/infra"); n != 0 {
		t.Errorf("the restarted daemon applied the Widget %d times; it was applied at this revision, want 0", n)
	}
	cd := getDeployment(t, c, ns, "three")
	if !stage(cd, "Base").FinishedAt.Equal(stage(before, "Base").FinishedAt) {
		t.Errorf("stage Base finishedAt moved from %v to %v across the restart", stage(before, "Base").FinishedAt, stage(cd, "Base").FinishedAt)
	}
	if !stage(cd, "Infra").StartedAt.Equal(stage(before, "Infra").StartedAt) {
		t.Errorf("stage Infra startedAt moved from %v to %v across the restart", stage(before, "Infra").StartedAt, stage(cd, "Infra").StartedAt)
	}

	setWidgetReady(t, c, ns, "infra")
	cd = waitDeployment(t, c, ns, "three", "Ready", isReady)
	if object(t, c, configMapGVK, ns, "app") == nil {
		t.Fatal("Ready, but stage App's ConfigMap is missing")
	}
	if n := api.total("PATCH /", "/configmaps/app"); n != 1 {
		t.Errorf("stage App's ConfigMap applied %d times, want exactly 1", n)
	}
	if n := api.total("PATCH /", "/configmaps/base"); n != 0 {
		t.Errorf("stage Base's ConfigMap applied %d times after the restart, want 0", n)
	}
	if n := api.total("PATCH(dry-run)", "/configmaps/base"); n != 0 {
		t.Errorf("the restarted daemon dry-ran Base's ConfigMap %d times, want 0", n)
	}
}
