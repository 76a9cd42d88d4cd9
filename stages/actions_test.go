package stages_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

func deployment(ns, name string, replicas int64) *unstructured.Unstructured {
	d := object("apps/v1", "Deployment", ns, name)
	labels := map[string]any{"app": name}
	d.Object["spec"] = map[string]any{
		"replicas": replicas,
		"selector": map[string]any{"matchLabels": labels},
		"template": map[string]any{
			"metadata": map[string]any{"labels": labels},
			"spec":     map[string]any{"containers": []any{map[string]any{"name": "c", "image": "registry.example/c:1"}}},
		},
	}
	return d
}

// A scale stage sets replicas on the workloads an earlier stage applied,
// under its own field manager; it refuses other kinds for good and retries
// a workload that is not there yet.
func TestScaleStage(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	ctx := testContext(t)
	ctrl := deployment(ns, "capm3-controller", 1)
	if _, err := e.Apply(ctx, []*unstructured.Unstructured{ctrl}, "Providers", owner); err != nil {
		t.Fatal(err)
	}

	disable := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "ControllersDisabled", Action: capstanv1.StageActionScale,
		Scale: &capstanv1.ScaleSpec{Replicas: ptr.To[int32](0)}}, Objects: []*unstructured.Unstructured{ctrl}}
	if res := e.ApplyStage(ctx, disable, owner); res.State != capstanv1.StageInProgress {
		t.Fatalf("scale to 0 = %s: %s", res.State, res.Message)
	}
	live := getLive(t, c, ctrl)
	if got, _, _ := unstructured.NestedInt64(live.Object, "spec", "replicas"); got != 0 {
		t.Errorf("spec.replicas = %d after the scale stage, want 0", got)
	}
	managers := map[string]bool{}
	for _, f := range live.GetManagedFields() {
		managers[f.Manager] = true
	}
	if !managers[stages.ScaleFieldManager] {
		t.Errorf("managers of %s = %v, want %s among them", stages.ObjectRef(ctrl), managers, stages.ScaleFieldManager)
	}

	cm := configMap(ns, "settings", nil)
	wrongKind := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Bad", Action: capstanv1.StageActionScale,
		Scale: &capstanv1.ScaleSpec{Replicas: ptr.To[int32](1)}}, Objects: []*unstructured.Unstructured{ctrl, cm}}
	if res := e.ApplyStage(ctx, wrongKind, owner); res.State != capstanv1.StageFailed || !stages.IsStalled(res.Err) ||
		!strings.Contains(res.Message, "Deployment") {
		t.Errorf("scaling a ConfigMap = %s (stalled %v, %q), want a stalled failure naming what can be scaled", res.State, stages.IsStalled(res.Err), res.Message)
	}
	if got, _, _ := unstructured.NestedInt64(getLive(t, c, ctrl).Object, "spec", "replicas"); got != 0 {
		t.Errorf("a stage refused for its ConfigMap still scaled its Deployment to %d: nothing may be half-applied", got)
	}

	missing := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Enable", Action: capstanv1.StageActionScale,
		Scale: &capstanv1.ScaleSpec{Replicas: ptr.To[int32](1)}}, Objects: []*unstructured.Unstructured{deployment(ns, "absent", 1)}}
	if res := e.ApplyStage(ctx, missing, owner); res.State != capstanv1.StageFailed || stages.IsStalled(res.Err) ||
		!strings.Contains(res.Message, "not found") {
		t.Errorf("scaling a missing Deployment = %s (stalled %v, %q), want a retryable failure saying not found", res.State, stages.IsStalled(res.Err), res.Message)
	}

	// Committed: each workload back at the count its rendered object has
	// (the committed 1 here, after the disable above; 1 too for one that
	// sets none, as the API server defaults it).
	bare := deployment(ns, "helm-controller", 1)
	unstructured.RemoveNestedField(bare.Object, "spec", "replicas")
	if _, err := e.Apply(ctx, []*unstructured.Unstructured{bare}, "Providers", owner); err != nil {
		t.Fatal(err)
	}
	zero := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Off", Action: capstanv1.StageActionScale,
		Scale: &capstanv1.ScaleSpec{Replicas: ptr.To[int32](0)}}, Objects: []*unstructured.Unstructured{bare}}
	if res := e.ApplyStage(ctx, zero, owner); res.State != capstanv1.StageInProgress {
		t.Fatalf("scale to 0 = %s: %s", res.State, res.Message)
	}
	committed := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Enabled", Action: capstanv1.StageActionScale,
		Scale: &capstanv1.ScaleSpec{Committed: true}}, Objects: []*unstructured.Unstructured{ctrl, bare}}
	if res := e.ApplyStage(ctx, committed, owner); res.State != capstanv1.StageInProgress || !strings.Contains(res.Message, "committed") {
		t.Fatalf("scale to the committed count = %s: %s", res.State, res.Message)
	}
	for _, obj := range []*unstructured.Unstructured{ctrl, bare} {
		if got, _, _ := unstructured.NestedInt64(getLive(t, c, obj).Object, "spec", "replicas"); got != 1 {
			t.Errorf("%s: spec.replicas = %d after scale.committed, want the committed 1", stages.ObjectRef(obj), got)
		}
	}

	noReplicas := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Vague", Action: capstanv1.StageActionScale},
		Objects: []*unstructured.Unstructured{ctrl}}
	if res := e.ApplyStage(ctx, noReplicas, owner); !stages.IsStalled(res.Err) || !strings.Contains(res.Message, "scale.replicas") ||
		!strings.Contains(res.Message, "scale.committed") {
		t.Errorf("a scale stage without a count = %s (%q), want a stalled failure naming scale.replicas and scale.committed", res.State, res.Message)
	}
}

// A delete stage deletes what it selects and waits until it is gone,
// naming the finalizers that hold it.
func TestDeleteStage(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	ctx := testContext(t)
	node := configMap(ns, "bootstrap-node", map[string]any{"role": "bootstrap"})
	node.SetFinalizers([]string{"capstan.dev/test-hold"})
	if _, err := e.Apply(ctx, []*unstructured.Unstructured{node}, "Bootstrap", owner); err != nil {
		t.Fatal(err)
	}
	stage := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "BootstrapNodeDeleted", Action: capstanv1.StageActionDelete},
		Objects: []*unstructured.Unstructured{configMap(ns, "bootstrap-node", nil), configMap(ns, "never-existed", nil)}}
	if res := e.ApplyStage(ctx, stage, owner); res.State != capstanv1.StageInProgress {
		t.Fatalf("delete = %s: %s", res.State, res.Message)
	}
	short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	res := e.WaitStage(short, stage, owner)
	cancel()
	if res.State != capstanv1.StageInProgress || !strings.Contains(res.Message, "capstan.dev/test-hold") {
		t.Errorf("wait with a finalizer holding = %s (%q), want InProgress naming the finalizer", res.State, res.Message)
	}

	live := getLive(t, c, node)
	live.SetFinalizers(nil)
	if err := c.Update(ctx, live); err != nil {
		t.Fatal(err)
	}
	if res := e.WaitStage(ctx, stage, owner); res.State != capstanv1.StageReady {
		t.Errorf("wait after the finalizer is gone = %s (%q), want Ready", res.State, res.Message)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(node), &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}}); err == nil {
		t.Error("bootstrap-node still exists after the delete stage is Ready")
	}
}

// An object committed only for a delete stage needs no apply stage.
func TestBuildPlanDeleteOnlyObject(t *testing.T) {
	specs := []capstanv1.StageSpec{
		{Name: "Apply", Select: capstanv1.Selector{Kinds: []string{"ConfigMap"}}},
		{Name: "Cleanup", Action: capstanv1.StageActionDelete, Select: capstanv1.Selector{Kinds: []string{"Secret"}}},
	}
	plan, err := stages.BuildPlan(specs, []*unstructured.Unstructured{
		object("v1", "ConfigMap", "ns", "kept"), object("v1", "Secret", "ns", "bootstrap-key"),
	})
	if err != nil {
		t.Fatalf("BuildPlan: %v", err)
	}
	if got := refs(plan.Stages[1].Objects); len(got) != 1 || !strings.Contains(got[0], "bootstrap-key") {
		t.Errorf("Cleanup objects = %v, want the Secret", got)
	}
	if len(plan.Stages[0].Objects) != 1 {
		t.Errorf("Apply objects = %v, want only the ConfigMap", refs(plan.Stages[0].Objects))
	}
}

// An LCMMachine committed with spec.stateItems, in a plan whose rollout
// sets them, is refused with the object and the field.
func TestBuildPlanRefusesCommittedStateItems(t *testing.T) {
	specs := []capstanv1.StageSpec{
		{Name: "Objects", Select: capstanv1.Selector{Kinds: []string{"*"}}},
		{Name: "Deploy", Action: capstanv1.StageActionRollout, Select: capstanv1.Selector{Kinds: []string{"lcm.capstan.dev/LCMMachine"}}},
	}
	m := object("lcm.capstan.dev/v1alpha1", "LCMMachine", "ns", "worker-0", func(u *unstructured.Unstructured) {
		u.Object["spec"] = map[string]any{"type": "worker", "stateItems": []any{map[string]any{"name": "join", "phase": "deploy"}}}
	})
	_, err := stages.BuildPlan(specs, []*unstructured.Unstructured{m, object("lcm.capstan.dev/v1alpha1", "LCMMachine", "ns", "worker-1")})
	if err == nil || !strings.Contains(err.Error(), "worker-0") || !strings.Contains(err.Error(), "spec.stateItems") ||
		!strings.Contains(err.Error(), "stage Deploy") || strings.Contains(err.Error(), "worker-1") {
		t.Errorf("BuildPlan = %v, want one error naming worker-0, spec.stateItems and stage Deploy", err)
	}
}
