package stages_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// An attempt at a stage counts its objects ready, for
// status.stages[].progress: so far when its wait ends, all of them when
// it is Ready.
func TestRunCountsTheObjectsReady(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	stage := widgetStage(
		widget(ns, "a", map[string]any{"size": int64(1)}),
		widget(ns, "b", map[string]any{"size": int64(1)}),
		widget(ns, "c", map[string]any{"size": int64(1)}),
	)
	ready := func(name string) {
		t.Helper()
		obj := widget(ns, name, nil)
		patch := client.RawPatch(types.MergePatchType, []byte(`{"status":{"ready":true}}`))
		if err := c.Status().Patch(testContext(t), obj, patch); err != nil {
			t.Fatalf("mark Widget %s ready: %v", name, err)
		}
	}
	run := func(opts stages.RunOptions) stages.Result {
		ctx, cancel := context.WithTimeout(testContext(t), 3*time.Second)
		defer cancel()
		return e.Run(ctx, stage, owner, opts)
	}

	if res := run(stages.RunOptions{}); res.State != capstanv1.StageInProgress || res.Progress.String() != "0/3 objects ready" {
		t.Fatalf("first attempt: %s with progress %q, want InProgress at 0/3 objects ready", res.State, res.Progress)
	}
	ready("a")
	ready("b")
	if res := run(stages.RunOptions{SkipApply: true}); res.State != capstanv1.StageInProgress || res.Progress.String() != "2/3 objects ready" {
		t.Fatalf("two ready: %s with progress %q, want InProgress at 2/3 objects ready", res.State, res.Progress)
	}
	ready("c")
	if res := run(stages.RunOptions{SkipApply: true}); res.State != capstanv1.StageReady || res.Progress.String() != "3/3 objects ready" {
		t.Fatalf("all ready: %s with progress %q, want Ready at 3/3 objects ready", res.State, res.Progress)
	}
}

// A stage waiting for an object that rolls out replicas shows how many
// are up to date (a control plane replacing its machines on an upgrade,
// here a Deployment its pods), not "0/1 objects ready"; once the object is
// ready the stage counts objects again.
func TestRunCountsTheReplicasOfARollout(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	deploy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": "web", "namespace": ns},
		"spec": map[string]any{
			"replicas": int64(5),
			"selector": map[string]any{"matchLabels": map[string]any{"app": "web"}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"app": "web"}},
				"spec":     map[string]any{"containers": []any{map[string]any{"name": "web", "image": "registry.example/web:2"}}},
			},
		},
	}}
	stage := &stages.Stage{
		StageSpec: capstanv1.StageSpec{Name: "Web", Action: capstanv1.StageActionApply},
		Objects:   []*unstructured.Unstructured{deploy},
	}
	run := func(opts stages.RunOptions) stages.Result {
		ctx, cancel := context.WithTimeout(testContext(t), 3*time.Second)
		defer cancel()
		return e.Run(ctx, stage, owner, opts)
	}
	status := func(updated int) {
		t.Helper()
		patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil,
			`{"status":{"observedGeneration":1,"replicas":5,"updatedReplicas":%d,"readyReplicas":5,"availableReplicas":5,`+
				`"conditions":[{"type":"Available","status":"True","reason":"MinimumReplicasAvailable"},`+
				`{"type":"Progressing","status":"True","reason":"NewReplicaSetAvailable"}]}}`, updated))
		if err := c.Status().Patch(testContext(t), deploy.DeepCopy(), patch); err != nil {
			t.Fatalf("write the Deployment's status: %v", err)
		}
	}

	if res := run(stages.RunOptions{}); res.State != capstanv1.StageInProgress || res.Progress.String() != "0/1 objects ready" {
		t.Fatalf("before any status: %s with progress %q, want InProgress at 0/1 objects ready", res.State, res.Progress)
	}
	status(3)
	if res := run(stages.RunOptions{SkipApply: true}); res.State != capstanv1.StageInProgress || res.Progress.String() != "3/5 replicas up to date" {
		t.Fatalf("rolling out: %s with progress %q, want InProgress at 3/5 replicas up to date", res.State, res.Progress)
	}
	status(5)
	if res := run(stages.RunOptions{SkipApply: true}); res.State != capstanv1.StageReady || res.Progress.String() != "1/1 objects ready" {
		t.Fatalf("rolled out: %s with progress %q (message %q), want Ready at 1/1 objects ready", res.State, res.Progress, res.Message)
	}
}
